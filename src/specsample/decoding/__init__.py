"""The generation loop and what it is made of: sampling controls, verification, drafters,
the round, the loop itself, and many sequences batched into one model call per round."""
