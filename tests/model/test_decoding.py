"""The decoding state (ring buffers of keys/values) computes exactly what the model computes without it."""

import pytest
import torch

from conftest import tiny_model
from txl.errors import TxlError
from txl.model import AttentionSpan, DecodingState, decoding

CASES = [
    {"mem_len": 5},
    {"mem_len": 5, "same_length": True},
    {"mem_len": 6, "clamp_len": 3, "untie_r": True},
    {"mem_len": 4, "pre_lnorm": True, "same_length": True, "clamp_len": 2},
    {"mem_len": 0},
    {"mem_len": 1, "same_length": True},
    {"attn_type": "shaw", "shaw_max_dist": 3, "mem_len": 6},
    {"attn_type": "shaw", "shaw_max_dist": 8, "mem_len": 5, "same_length": True},
    {"attn_type": "rope", "mem_len": 5},
    {"attn_type": "rope", "mem_len": 4, "pre_lnorm": True, "same_length": True},
]


def _big_weights(model):
    """Large random weights, so that a wrong key, slot or distance moves the logits visibly."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize("overrides", CASES)
def test_state_equals_the_memory_recomputed_every_call(overrides):
    """Segments of 1..4 tokens in an irregular order, through many rotations of the ring: the state's
    logits and memory equal those of the plain model given the hidden-state memory (float64, 1e-10)."""
    model = _big_weights(tiny_model(tgt_len=4, **overrides))
    span = model.config.span
    state = DecodingState(model.config.n_layer, span)
    tokens = torch.randint(0, 37, (3, 60), generator=torch.Generator().manual_seed(2))
    sizes = [3, 1, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1, 1, 1, 1]
    mems, start, steps = None, 0, 0
    with torch.no_grad():
        for size in sizes:
            x = tokens[:, start:start + size]
            want = model(x, mems=mems)
            got = model(x, caches=state)
            assert got.mems is None
            torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-10)
            mems, start = want.mems, start + size
            steps += size
            if span.mem_len > 0:
                for ours, theirs in zip(state.mems(), mems):
                    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
    assert steps > 3 * state.capacity  # the ring has turned over several times


@pytest.mark.parametrize("overrides", [c for c in CASES if c["mem_len"] > 0 and c.get("attn_type") != "rope"])
def test_a_stacked_state_and_its_ring_step_equal_the_memory_recomputed(overrides):
    """A state without spare room (one tensor [2, L, B, H, S, D], as compiled steps read it):
    the same logits as the plain model, whether a one-token call takes the model's step or the ring's
    (RingDecoder's step module over the stack), through several turns of the ring; a reorder keeps
    every layer's buffers inside the stack (float64, 1e-10)."""
    from txl.generation.compiled import RingDecoder

    model = _big_weights(tiny_model(tgt_len=4, **overrides))
    c, span = model.config, model.config.span
    decoder = RingDecoder(model, span)
    state = decoder.state
    tokens = torch.randint(0, 37, (3, 46), generator=torch.Generator().manual_seed(4))
    sizes = [3, 1, 1, 4, 1, 1, 1, 2] + [1] * 31
    mems, start = None, 0
    with torch.no_grad():
        for i, size in enumerate(sizes):
            x = tokens[:, start:start + size]
            want = model(x, mems=mems)
            got = decoder.step(x)[:, None] if size == 1 and i % 2 else model(x, caches=state).logits[:, -1:]
            torch.testing.assert_close(got, want.logits[:, -1:], rtol=0, atol=1e-10)
            mems, start = want.mems, start + size
            assert state.stack.shape == (2, c.n_layer, 3, c.n_head, state.capacity, c.d_head)
            assert all(cache.keys.data_ptr() == state.stack[0, j].data_ptr() for j, cache in enumerate(state.layers))
        index = torch.tensor([2, 0, 0])
        state.reorder(index)
        assert all(cache.values.data_ptr() == state.stack[1, j].data_ptr() for j, cache in enumerate(state.layers))
        mems = [m[index] for m in mems]
        x = tokens[index, start:start + 1]
        torch.testing.assert_close(decoder.step(x), model(x, mems=mems).logits[:, -1], rtol=0, atol=1e-10)
    assert start > 2 * state.capacity  # the ring has turned over


def test_a_ring_decoder_reads_each_prompt_afresh_and_refuses_a_broken_state():
    """read_prompt drops what an earlier call read (a benchmark reuses one decoder); a step after a read that
    failed inside the layers, or with another batch size, is refused in one line."""
    from txl.generation.compiled import RingDecoder

    model = tiny_model(tgt_len=4)
    decoder = RingDecoder(model, model.config.span)
    prompt = torch.randint(0, 37, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        decoder.read_prompt(prompt[:, :-1])
        first = decoder.step(prompt[:, -1:])
        decoder.read_prompt(prompt[:, :-1])
        torch.testing.assert_close(decoder.step(prompt[:, -1:]), first, rtol=0, atol=0)
        mems = model(prompt[:, 4:8], mems=model(prompt[:, :4]).mems).mems  # read in segments of tgt_len
        torch.testing.assert_close(first, model(prompt[:, -1:], mems=mems).logits[:, -1], rtol=0, atol=1e-10)
        with pytest.raises(TxlError, match="the decoding state holds 2 rows but input_ids has 3"):
            decoder.step(torch.zeros(3, 1, dtype=torch.long))

        def fail(module, inputs):
            raise RuntimeError("a layer failed")

        hook = model.layers[1].register_forward_pre_hook(fail)
        try:
            with pytest.raises(RuntimeError, match="a layer failed"):
                decoder.read_prompt(prompt[:, :-1])
        finally:
            hook.remove()
        with pytest.raises(TxlError, match="left half updated by a call that failed"):
            decoder.step(prompt[:, -1:])


def test_a_state_allocates_its_buffers_once_at_their_full_size():
    """The first call allocates every layer's keys and values in one tensor, S slots plus the spare room of
    segment views (none without spare_room); nbytes counts them; no later call reallocates."""
    model = tiny_model(tgt_len=4, mem_len=40)
    c = model.config
    tokens = torch.randint(0, 37, (2, 120))
    for spare, room in ((True, 41 + 8), (False, 41)):
        state = DecodingState(c.n_layer, c.span, spare_room=spare)
        with torch.no_grad():
            model(tokens[:, :3], caches=state)
            pointer = state.stack.data_ptr()
            for start in range(3, 120, 5):
                model(tokens[:, start:start + (1 if start % 2 else 5)], caches=state)
        assert state.stack.shape == (2, c.n_layer, 2, c.n_head, room, c.d_head) and state.stack.data_ptr() == pointer
        assert all(cache.hidden.shape == (2, room, c.d_model) for cache in state.layers)
        assert state.nbytes(c, 2, 8) == (state.stack.numel() + sum(x.hidden.numel() for x in state.layers)) * 8


@pytest.mark.parametrize("overrides", CASES)
def test_each_sub_layer_step_equals_its_forward(overrides):
    """Layer by layer, token after token through several turns of the ring: the attention sub-layer's
    one-token ``step`` (ring buffers, rotated position table) equals its ``forward`` over the hidden-state
    memory, and the feed-forward ``step`` its ``forward``, each given the same input (float64, 1e-10), so
    that a drift between the two paths is found in the sub-layer where it starts."""
    from txl.model.attention import attention_mask

    model = _big_weights(tiny_model(tgt_len=4, **overrides))
    c, span = model.config, model.config.span
    state = DecodingState(c.n_layer, span)
    tokens = torch.randint(0, 37, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model(tokens[:, :3], caches=state)  # a multi-token start, then one token at a time
        for t in range(3, tokens.size(1)):
            mems = state.mems() or [None] * c.n_layer
            mlen = 0 if mems[0] is None else mems[0].size(1)
            mask = attention_mask(1, mlen, span.same_length, span.mem_len, "cpu")
            # the forward's positions count in the window (keys 0 .. mlen); the step's at the text position
            positions = model.positions.segment(c, mlen + 1, 0, span, "cpu", torch.float64, model.drop)
            klen = min(state.length + 1, state.capacity)
            # what TransformerXLLM._step does around the layers
            state.begin(1, klen, (2, c.n_head, c.d_head), torch.float64, torch.device("cpu"))
            step_positions = model.positions.step_positions(state, c, torch.device("cpu"), torch.float64)
            state.bind(2, torch.float64)
            h = model.word_emb(tokens[:, t:t + 1])
            for layer, cache, mem in zip(model.layers, state.layers, mems):
                attended = layer.attn(h, mem, positions, mask)
                torch.testing.assert_close(layer.attn.step(h, cache, None, step_positions), attended, rtol=0,
                                           atol=1e-10)
                h = layer.ff(attended)
                torch.testing.assert_close(layer.ff.step(attended), h, rtol=0, atol=1e-10)
            state.commit(klen)
    assert tokens.size(1) > 3 * state.capacity  # the ring has turned over several times


@pytest.mark.parametrize("overrides", CASES)
def test_segments_after_the_memory_are_views_of_the_buffers(overrides):
    """Multi-token calls after the memory (as evaluation makes them) write their keys after the memory and
    attend through one view of the buffers: through slots moving forward, moves back to position 0, a
    rotated ring and calls too long for the spare room, logits and memory equal the plain model's (float64,
    1e-10), and no call reallocates the buffers."""
    model = _big_weights(tiny_model(tgt_len=4, **overrides))
    span = model.config.span
    state = DecodingState(model.config.n_layer, span)
    tokens = torch.randint(0, 37, (2, 140), generator=torch.Generator().manual_seed(3))
    sizes = [4, 4, 4, 4, 4, 4, 4, 1, 1, 3, 4, 4, 13, 2, 2, 2, 2, 2, 2, 2, 1, 4, 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6]
    mems, start, starts, pointers = None, 0, set(), set()
    with torch.no_grad():
        for size in sizes:
            x = tokens[:, start:start + size]
            want = model(x, mems=mems)
            got = model(x, caches=state)
            torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-10)
            mems, start = want.mems, start + size
            starts.add(state.start)
            if 2 <= start // 4 <= 7 and span.mem_len > 0:  # equal segments after the buffers grew
                pointers.add(state.layers[0].keys.data_ptr())
            if span.mem_len > 0:
                for ours, theirs in zip(state.mems(), mems):
                    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
    if span.mem_len >= 4:  # (a memory of 1 has no room to gain: every call concatenates)
        assert len(starts) > 2 and len(pointers) == 1 and state.stack.size(4) > state.capacity


def test_state_takes_a_starting_memory_and_refuses_a_second_one():
    model = _big_weights(tiny_model(tgt_len=4, mem_len=5))
    tokens = torch.randint(0, 37, (2, 12))
    with torch.no_grad():
        mems = model(tokens[:, :7]).mems
        want = model(tokens[:, 7:8], mems=mems)
        state = DecodingState(model.config.n_layer, model.config.span)
        got = model(tokens[:, 7:8], mems=mems, caches=state)
        torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-10)
        with pytest.raises(TxlError, match="already holds the memory"):
            model(tokens[:, 8:9], mems=mems, caches=state)
        with pytest.raises(TxlError, match="holds 2 rows"):
            model(tokens[:1, 8:9], caches=state)
    with pytest.raises(TxlError, match="without autograd"):
        model(tokens[:, 8:9], caches=state)
    # the one-token step has no dropout: in train mode the state would not give the forward's result
    model.train()
    with torch.no_grad(), pytest.raises(TxlError, match="evaluation mode"):
        model(tokens[:, 8:9], caches=state)
    model.eval()
    with torch.no_grad():  # the refusal changed nothing: the state reads on as the memory does
        torch.testing.assert_close(model(tokens[:, 8:9], caches=state).logits,
                                   model(tokens[:, 8:9], mems=model(tokens[:, 7:8], mems=mems).mems).logits,
                                   rtol=0, atol=1e-10)


def test_reorder_selects_rows_of_the_state():
    """Reordering the state's rows (beam search) equals decoding the selected rows from the start."""
    model = _big_weights(tiny_model(tgt_len=4, mem_len=4))
    tokens = torch.randint(0, 37, (3, 20))
    index = torch.tensor([2, 0, 2])
    with torch.no_grad():
        state = DecodingState(model.config.n_layer, model.config.span)
        for t in range(12):  # past one full turn of the ring (capacity 5)
            model(tokens[:, t:t + 1], caches=state)
        state.reorder(index)
        got = model(tokens[index, 12:13], caches=state).logits
        alone = DecodingState(model.config.n_layer, model.config.span)
        for t in range(12):
            model(tokens[index, t:t + 1], caches=alone)
        want = model(tokens[index, 12:13], caches=alone).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_a_step_copies_nothing_of_the_memory():
    """Once the ring is full a step writes one slot per layer: the buffers are never reallocated."""
    model = tiny_model(tgt_len=4, mem_len=6)
    state = DecodingState(model.config.n_layer, model.config.span, keep_mems=False)
    with torch.no_grad():
        model(torch.randint(0, 37, (2, 8)), caches=state)
        buffers = [(c.keys.data_ptr(), c.values.data_ptr()) for c in state.layers]
        for _ in range(20):
            model(torch.randint(0, 37, (2, 1)), caches=state)
    assert [(c.keys.data_ptr(), c.values.data_ptr()) for c in state.layers] == buffers
    assert all(c.hidden is None for c in state.layers)
    with pytest.raises(TxlError, match="keep_mems=False"):
        state.mems()


def test_state_refuses_what_it_cannot_serve():
    model = tiny_model(attn_type="abs")
    with pytest.raises(TxlError, match="needs a model with memory"):
        with torch.no_grad():
            model(torch.randint(0, 37, (1, 2)), caches=DecodingState(3, AttentionSpan(4, 4)))
    with pytest.raises(TxlError, match="must be a txl.model.DecodingState"):
        with torch.no_grad():
            tiny_model()(torch.randint(0, 37, (1, 2)), caches=[None, None, None])
    with pytest.raises(TxlError, match="AttentionSpan"):
        DecodingState(3, {"mem_len": 4})
    with pytest.raises(TxlError, match="made for 5 layers but the model has 3"):
        with torch.no_grad():
            tiny_model()(torch.randint(0, 37, (1, 2)), caches=DecodingState(5, AttentionSpan(4, 4)))


@pytest.mark.parametrize("mem_len, size, kind", [(80, 3, "chunks"), (40, 3, "chunks"), (40, 40, "apart")])
def test_segments_move_the_memory_back_exactly(mem_len, size, kind, monkeypatch):
    """When the spare room is used up the memory moves back to the start of its buffers, in chunks or
    without overlap; logits equal the plain model's (float64, 1e-10)."""
    moves = []
    move = decoding.move_to_front

    def spy(buffer, dim, source, n):
        moves.append("apart" if source >= n else "chunks")
        move(buffer, dim, source, n)

    monkeypatch.setattr(decoding, "move_to_front", spy)
    model = _big_weights(tiny_model(tgt_len=max(4, size), mem_len=mem_len))  # (spare room: 2 tgt_len or S / 8)
    state = DecodingState(model.config.n_layer, model.config.span)
    tokens = torch.randint(0, 37, (2, mem_len + 12 * size), generator=torch.Generator().manual_seed(size))
    mems = None
    with torch.no_grad():
        for start in [0] + list(range(mem_len, tokens.size(1), size)):
            x = tokens[:, start:start + (mem_len if start == 0 else size)]
            want = model(x, mems=mems)
            torch.testing.assert_close(model(x, caches=state).logits, want.logits, rtol=0, atol=1e-10)
            mems = want.mems
    assert len(moves) >= 2 and set(moves) == {kind}


@pytest.mark.parametrize("source, n", [(0, 5), (1, 40), (6, 40), (3, 7), (40, 40), (50, 40)])
def test_move_to_front_moves_every_entry(source, n):
    """Whole copies (overlap of under 1/16), chunks and disjoint ranges all move the same entries."""
    buffer = torch.arange(2 * 3 * 100 * 2, dtype=torch.float64).view(2, 3, 100, 2)
    want = buffer[:, :, source:source + n].clone()
    decoding.move_to_front(buffer, 2, source, n)
    assert torch.equal(buffer[:, :, :n], want)


def test_a_refused_call_leaves_no_stale_positions():
    """A call refused after the key length was seen (bad padding) must not leave that length's position
    keys marked as held: the next call of that length equals the plain model."""
    model = _big_weights(tiny_model(tgt_len=4, mem_len=6))
    state = DecodingState(model.config.n_layer, model.config.span)
    x = torch.randint(0, 37, (2, 20), generator=torch.Generator().manual_seed(0))
    mems = None
    with torch.no_grad():
        for a, b in ((0, 4), (4, 8), (8, 11)):  # the last call has key length 9
            mems = model(x[:, a:b], mems=mems).mems
            model(x[:, a:b], caches=state)
        with pytest.raises(TxlError, match="mem_padding"):
            model(x[:, 11:15], caches=state, mem_padding=torch.tensor([99, 0]))  # key length 10, refused
        got = model(x[:, 11:15], caches=state).logits
        want = model(x[:, 11:15], mems=mems)
        torch.testing.assert_close(got, want.logits, rtol=0, atol=1e-10)
        with pytest.raises(TxlError, match="labels"):  # refused before the state takes the segment in
            model(x[:, 15:18], caches=state, labels=torch.full((2, 3), 99))
        got = model(x[:, 15:18], caches=state).logits
        torch.testing.assert_close(got, model(x[:, 15:18], mems=want.mems).logits, rtol=0, atol=1e-10)


def test_a_state_keeps_one_dtype_and_a_failed_call_spoils_it(monkeypatch):
    model = tiny_model(tgt_len=4, mem_len=6, dtype=torch.float32)
    x = torch.randint(0, 37, (2, 12))
    with torch.no_grad():
        state = DecodingState(model.config.n_layer, model.config.span)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x[:, :4], caches=state)
        for part in (x[:, 4:8], x[:, 4:5]):  # a segment and a step without autocast
            with pytest.raises(TxlError, match="holds torch.bfloat16 keys but this call computes in torch.float32"):
                model(part, caches=state)
        state = DecodingState(model.config.n_layer, model.config.span)
        model(x[:, :4], caches=state)

        def broken(*args, **kwargs):
            raise RuntimeError("out of memory")

        monkeypatch.setattr(model.layers[1], "forward", broken)
        with pytest.raises(RuntimeError, match="out of memory"):
            model(x[:, 4:8], caches=state)
        monkeypatch.undo()
        with pytest.raises(TxlError, match="half updated"):
            model(x[:, 8:9], caches=state)


def test_mems_are_copies():
    model = _big_weights(tiny_model(tgt_len=4, mem_len=6))
    state = DecodingState(model.config.n_layer, model.config.span)
    x = torch.randint(0, 37, (1, 16))
    with torch.no_grad():
        model(x[:, :8], caches=state)
        held = state.mems()
        kept = [m.clone() for m in held]
        model(x[:, 8:12], caches=state)
        model(x[:, 12:13], caches=state)
    assert all(torch.equal(a, b) for a, b in zip(held, kept))


def test_few_row_products_keep_the_autocast_dtype():
    """Under bf16 autocast a batch-1 step's logits come out in bf16, as the plain forward's do, and
    close to them (an even vocabulary, so the output layer takes the row-block product)."""
    model = tiny_model(tgt_len=4, mem_len=6, dtype=torch.float32, vocab_size=38)
    x = torch.randint(0, 38, (1, 9))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        state = DecodingState(model.config.n_layer, model.config.span)
        model(x[:, :8], caches=state)
        got = model(x[:, 8:9], caches=state).logits
        want = model(x[:, 8:9], mems=model(x[:, :8]).mems).logits
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=0.05, atol=0.05)


def test_a_state_refuses_what_is_not_its_own():
    model = tiny_model(tgt_len=4, mem_len=6)
    other = tiny_model(tgt_len=4, mem_len=6, seed=1)
    x = torch.randint(0, 37, (2, 8))
    with torch.no_grad():
        state = DecodingState(model.config.n_layer, model.config.span)
        with pytest.raises(TxlError, match="mem_padding"):  # refused before it binds anything
            model(x[:, :4], caches=state, mem_padding=torch.tensor([3, 0]))
        model(x[:1, :4], caches=state)  # so another batch size is still free
        with pytest.raises(TxlError, match="another model"):
            other(x[:1, 4:5], caches=state)
        for bad in (torch.tensor([1, 0]), torch.tensor([0.0]), torch.tensor([[0]]), [0]):
            with pytest.raises(TxlError, match="reorder"):
                state.reorder(bad)
        with pytest.raises(TxlError, match="n_layer must be an integer"):
            DecodingState("2", model.config.span)


def test_the_bound_dtype_is_the_keys_dtype():
    """A float64 model under bf16 autocast computes float64 keys (autocast casts float32 only): the state
    takes a later call without autocast."""
    model = tiny_model(tgt_len=4, mem_len=6)
    x = torch.randint(0, 37, (2, 8))
    with torch.no_grad():
        state = DecodingState(model.config.n_layer, model.config.span)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x[:, :4], caches=state)
        assert state.dtype == torch.float64
        model(x[:, 4:8], caches=state)


BOUNDED_CASES = [
    {"mem_len": 10_000},
    {"mem_len": 10_000, "same_length": True, "clamp_len": 20},
    {"attn_type": "shaw", "shaw_max_dist": 30, "mem_len": 10_000},
    {"attn_type": "rope", "mem_len": 10_000},
]


@pytest.mark.parametrize("overrides", BOUNDED_CASES)
def test_a_state_sized_for_its_text_holds_a_memory_longer_than_the_text(overrides):
    """mem_len 10,000 on a text of 230 tokens with max_tokens=230: buffers of 230 slots; steps and segments
    in an irregular order give the plain model's logits and memory (float64, 1e-10); a token past
    max_tokens is refused with one line, and the state reads on."""
    model = _big_weights(tiny_model(tgt_len=4, **overrides))
    c = model.config
    state = DecodingState(c.n_layer, c.span, max_tokens=230)
    tokens = torch.randint(0, 37, (2, 231), generator=torch.Generator().manual_seed(4))
    sizes = [5] + [1] * 30 + [4, 7, 1, 1, 3] + [1] * 20 + [9, 9, 2] + [1] * 40 + [12, 1, 1, 5] + [1] * 25 + [20, 30, 1]
    sizes += [1] * (230 - sum(sizes))
    mems, start = None, 0
    with torch.no_grad():
        for size in sizes:
            x = tokens[:, start:start + size]
            want = model(x, mems=mems)
            torch.testing.assert_close(model(x, caches=state).logits, want.logits, rtol=0, atol=1e-10)
            mems, start = want.mems, start + size
            for ours, theirs in zip(state.mems(), mems):
                torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-10)
        assert state.capacity == 230 and state.stack.size(4) == 230 and state.length == 230  # (no spare room)
        with pytest.raises(TxlError, match=r"max_tokens=230 tokens and holds 230; a call of 1 more"):
            model(tokens[:, 230:], caches=state)
        assert not state.failed and state.length == 230
    with pytest.raises(TxlError, match="max_tokens must be an integer >= 1"):
        DecodingState(c.n_layer, c.span, max_tokens=0)


def test_a_bounded_state_counts_its_starting_memory():
    """A starting memory's tokens count toward max_tokens; a bound of at least S slots changes nothing."""
    model = _big_weights(tiny_model(tgt_len=4, mem_len=6))
    c = model.config
    tokens = torch.randint(0, 37, (2, 30), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        mems = model(tokens[:, :5]).mems
        state = DecodingState(c.n_layer, c.span, max_tokens=6)
        with pytest.raises(TxlError, match="a call of 7 more does not fit"):
            model(tokens[:, 5:7], mems=mems, caches=state)
        model(tokens[:, 5:6], mems=mems, caches=state)  # 5 of memory and 1 token: the bound
        assert state.capacity == 6 < state.slots == 7
        wide = DecodingState(c.n_layer, c.span, max_tokens=7)
        for t in range(20):  # past max_tokens: with S slots the ring turns over as any state's
            got = model(tokens[:, t:t + 1], caches=wide).logits
        mems = None
        for t in range(19):  # the plain model, token by token
            mems = model(tokens[:, t:t + 1], mems=mems).mems
        want = model(tokens[:, 19:20], mems=mems).logits
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_a_state_takes_numpy_integers_and_refuses_what_cannot_be_allocated_in_one_line():
    """max_tokens may be a numpy integer (as generate's max_new_tokens may); keys and values the device
    cannot allocate are refused with one line naming mem_len and max_tokens, and nothing is left bound."""
    import numpy as np

    from txl.generation import beam_search, generate

    model = tiny_model(tgt_len=4, mem_len=6)
    prompt = torch.randint(0, 37, (1, 5))
    assert DecodingState(3, model.config.span, max_tokens=np.int64(5)).capacity == 5
    assert generate(model, prompt, np.int64(3), temperature=0).shape == (1, 8)
    assert len(beam_search(model, prompt, 2, np.int64(3)).tokens) == 3
    huge = tiny_model(tgt_len=4, mem_len=10**13)
    state = DecodingState(3, huge.config.span)
    with torch.no_grad(), pytest.raises(TxlError, match=r"mem_len 10,000,000,000,000 needs .* make it with max_tokens"):
        huge(prompt, caches=state)
    assert state.stack is None and state.length == 0 and not state.failed
