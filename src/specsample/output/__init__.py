"""Rules on what the loop emits and how it is read: grammars, tool calls, text stops,
detokenizing, log-probabilities, and the editor features (fill-in-the-middle prompts,
llama.cpp's infill sampler)."""
