"""Online drafter training: buffer, spot trainer, checkpoints, export."""
