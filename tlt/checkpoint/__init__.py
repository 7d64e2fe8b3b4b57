"""Whole-run checkpoints: the folder format (`store`), which checkpoint a run resumes from (`recovery`), and what a
resume must keep (`resume_guard`, `drafter_fit`)."""
