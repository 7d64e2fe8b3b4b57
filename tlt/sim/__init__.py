"""`tlt simulate`: a discrete-event model of RL steps (vanilla, static drafter, TLT) on a GPU cluster."""
