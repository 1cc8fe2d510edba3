"""Training: schedules, checkpoints and the segment-recurrent training loop."""
