"""``txl summarize``: a fine-tuned model's completion for each document (:mod:`.command`), with ROUGE
against reference summaries (:mod:`.rouge`)."""
