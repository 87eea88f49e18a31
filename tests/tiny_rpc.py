"""A model for the RPC tests whose claims hold for any model (connections, freeing,
keys, greedy equality on a split target): tiny_gguf.py's one random layer, which two
workers take in milliseconds where the real 0.5B model's 400 MB took seconds a load.
Split "1,1" over two workers, its block goes to the first and its output layer to the
second (llama.cpp places n_layer + 1 layers by the split's shares)."""

from pathlib import Path

from tiny_gguf import write_tiny_gguf

EOS = 257  # its one end-of-generation token
NO_EOS_FLAGS = ["--logit-bias", f"{EOS}=-100"]  # a run of exactly --max-new-tokens


def write_tiny_rpc_gguf(folder: Path) -> str:
    """The model's path in `folder`, as load_backend and --target take it."""
    return str(write_tiny_gguf(folder / "tiny.gguf", specials=("<|endoftext|>",)))
