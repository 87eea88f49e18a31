"""Command line: thin argparse subcommands over the library."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

from .app.arguments import (UsageError, add_draft_length_arguments, add_model_arguments, add_sampling_controls,
                            add_trace_argument, add_verifier_argument, check_trace, model_options, sampling_config)
from .app.assemble import assemble
from .app.check_cli import add_check_parser
from .backends.models import DEFAULT_MODELS, ModelError, fetch_default
from .bench.cli import add_bench_parser
from .decoding.generate import GenerationConfig, check_prompt, stream
from .output.constraints import Constraint
from .output.fim import fim_prompt
from .policy.make import check_draft_length
from .policy.trace import format_summary, read_lines, summarise, traced
from .serve.cli import add_serve_parser


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    add_draft_length_arguments(p)
    add_sampling_controls(p)
    p.add_argument("--seed", type=int, default=0)
    add_verifier_argument(p)
    p.add_argument("--max-new-tokens", type=int, default=128)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specsample", description="Exact speculative sampling (Chen et al. 2023).")
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser("generate", help="sample a continuation, streaming it to stdout")
    add_model_arguments(g)
    add_sampling_arguments(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-file", type=Path)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the target's chat template")
    after = g.add_mutually_exclusive_group()
    after.add_argument("--suffix", help="fill in the middle: the prompt is the text before it, this the text after "
                                        "(the model's own FIM tokens; empty: a plain completion)")
    after.add_argument("--suffix-file", type=Path, help="--suffix read from a file")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--autoregressive", action="store_true", help="run the target alone (the baseline)")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    shape = g.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", type=Path, metavar="FILE",
                       help="the output is JSON valid under this JSON schema (laid out as json.dumps does)")
    shape.add_argument("--regex", help="the output matches this regular expression (Rust regex syntax)")
    shape.add_argument("--grammar", type=Path, metavar="FILE",
                       help="the output matches this grammar: llguidance's Lark syntax, or llama.cpp's GBNF")
    g.add_argument("--logprobs", type=int, metavar="N",
                   help="with --json: each token's log-probability and the N likeliest alternatives")
    g.add_argument("--logprobs-mode", choices=("raw", "processed"), default="raw",
                   help="raw: the model's own; processed: after the sampling controls")
    add_trace_argument(g)
    g.set_defaults(func=cmd_generate)

    f = sub.add_parser("fetch", help="download and verify the default GGUF models")
    f.add_argument("names", nargs="*", help=f"default: all of {', '.join(DEFAULT_MODELS)}")
    f.set_defaults(func=cmd_fetch)

    add_rpc_worker_parser(sub)
    add_bench_parser(sub)
    add_serve_parser(sub)
    add_check_parser(sub)
    add_trace_parser(sub)
    return parser


def add_rpc_worker_parser(sub) -> None:
    w = sub.add_parser("rpc-worker", help="serve this machine's CPU to a target split over llama.cpp RPC workers")
    w.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s: this machine only; "
                                                       "without --rpc-key the protocol has no authentication)")
    w.add_argument("--port", type=int, default=50052, help="default %(default)s, as llama.cpp's rpc-server")
    w.add_argument("--threads", type=int, default=None, help="CPU threads for the layers it holds (default: all cores)")
    w.add_argument("--mem", type=int, default=None, metavar="MB",
                   help="memory it offers, which llama.cpp's default split follows (default: what is available)")
    w.add_argument("--cache", action="store_true",
                   help="keep the tensors it receives on disk, by hash, so a model loads faster the next time")
    w.add_argument("--rpc-key", default=None, metavar="KEY",
                   help="a shared secret clients must prove they hold (their --rpc-key or $SPECSAMPLE_RPC_KEY) "
                        "before they are served; it never crosses the wire, the traffic is not encrypted "
                        "(default: $SPECSAMPLE_RPC_KEY, else none: anyone who reaches the port is served)")
    w.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="seconds a connection may take to say HELLO, stall inside a message, or idle holding "
                        "no memory here, before it is closed (default %(default)s)")
    w.add_argument("--unguarded", action="store_true",
                   help="serve llama.cpp's RPC server on the port itself, with no guard in front: no bounds, "
                        "timeouts, restart or key (for measuring what the guard costs)")
    w.set_defaults(func=cmd_rpc_worker)


def add_trace_parser(sub) -> None:
    t = sub.add_parser("trace", help="sum up a --trace file: time by round kind, why plain, price error, catch-up")
    t.add_argument("file", type=Path, help="what --trace FILE wrote (generate, serve or bench)")
    t.set_defaults(func=cmd_trace)


def generation_config(args) -> GenerationConfig:
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens, sampling=sampling_config(args),
        seed=args.seed, stop_strings=tuple(getattr(args, "stop", ())), constraint=output_constraint(args),
        verifier=getattr(args, "verifier", "auto"),
        logprobs=getattr(args, "logprobs", None), logprobs_mode=getattr(args, "logprobs_mode", "raw"),
    )


def output_constraint(args) -> Constraint | None:
    """--json-schema, --regex or --grammar, compiled (a bad one fails before any model loads)."""
    if getattr(args, "regex", None) is not None:
        return Constraint.regex(args.regex)
    for option, kind in (("json_schema", "json_schema"), ("grammar", "grammar")):
        path = getattr(args, option, None)
        if path is not None:
            return Constraint(kind, read_input(path, f"--{option.replace('_', '-')} file"))
    return None


def read_input(path: Path, what: str) -> str:
    """Any file that can be read, /dev/null and pipes too: a process substitution
    (--prompt-file <(...)) is a FIFO, which Path.is_file() calls missing."""
    try:
        return path.read_text()
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    except OSError as e:
        raise UsageError(f"{what} {path} cannot be read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not UTF-8 text") from None


def prompt_text(args, suffix: str = "") -> str:
    text = args.prompt if args.prompt_file is None else read_input(args.prompt_file, "prompt file")
    if not suffix:  # before a suffix an empty prompt is a cursor at the start of a file
        check_prompt(text)
    return text


def suffix_text(args) -> str:
    """--suffix or --suffix-file's text ("" for neither), checked before any model loads."""
    path = getattr(args, "suffix_file", None)
    suffix = read_input(path, "suffix file") if path is not None else getattr(args, "suffix", None) or ""
    if suffix and args.chat:
        raise UsageError("--suffix fills in the middle of plain text; it does not go with --chat")
    return suffix


def prompt_ids(text: str, chat: bool, target, suffix: str = "") -> list[int]:
    if target.tokenizer is None:
        raise UsageError(f"{target.name} has no tokenizer")
    if suffix:
        if target.fim is None:
            raise UsageError(f"--suffix: {target.name} has no fill-in-the-middle tokens (prefix, suffix and middle) "
                             f"in its vocabulary")
        return fim_prompt(target.fim, target.tokenizer.text_ids, text, suffix)
    return target.tokenizer.chat_prompt(text) if chat else target.tokenizer.encode(text)


def cmd_generate(args) -> int:
    # Every input is read and checked before the slow model load.
    check_draft_length(args.k, args.k_max)
    check_trace(args)
    config = generation_config(args)
    suffix = suffix_text(args)
    text = prompt_text(args, suffix)
    models = assemble(model_options(args), drafting=not args.autoregressive)
    target, drafter = models.target, models.drafter(config.sampling)
    ids = prompt_ids(text, args.chat, target, suffix)
    policy = models.policy(args.k, args.k_max)
    with traced(policy, args.trace):
        s = stream(target, ids, config, drafter, policy, overlap=models.overlap)
        for chunk in s:
            if not args.json:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
    result = s.result
    if args.json:
        out = {"text": result.text, "token_ids": result.token_ids, "stop_reason": result.stop_reason,
               "stats": result.stats.as_dict()}
        if result.logprobs is not None:
            out["logprobs"] = [{"token": lp.token, "logprob": lp.logprob, "top": lp.top} for lp in result.logprobs]
        json.dump(out, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("\n")
        print(format_stats(result.stats, drafter is not None), file=sys.stderr)
    return 0


def format_stats(stats, speculative: bool) -> str:
    line = f"{stats.new_tokens} tokens in {stats.total_seconds:.2f} s: {stats.tokens_per_second:.2f} tokens/s, " \
           f"{stats.target_calls} target calls"
    if speculative:
        rate = "n/a" if stats.acceptance_rate is None else f"{stats.acceptance_rate:.2f}"
        line += f", {stats.draft_calls} draft calls, acceptance {rate}, " \
                f"{stats.mean_tokens_per_target_call:.2f} tokens per target call, " \
                f"accepted-per-round histogram {stats.accepted_histogram}, " \
                f"draft-length histogram {stats.draft_length_histogram} ({stats.plain_rounds} plain steps)"
        if stats.sources:
            line += ", by source " + ", ".join(f"{k}: {r} rounds {a}/{d} accepted" for k, (r, d, a) in stats.sources.items())
    if stats.forced_tokens:
        line += f", {stats.forced_tokens} tokens forced by the grammar"
    return line + f" (prefill {stats.prefill_seconds:.2f} s, draft {stats.draft_seconds:.2f} s, " \
                  f"target {stats.target_seconds:.2f} s, other {stats.other_seconds:.2f} s)"


def cmd_trace(args) -> int:
    lines, unreadable = read_lines(args.file)  # a missing file: main's one-line error
    print(format_summary(summarise(lines)))
    if unreadable:  # the last line of a process killed while writing it
        print(f"specsample trace: {unreadable} line(s) could not be read and were left out", file=sys.stderr)
    return 0


def cmd_fetch(args) -> int:
    for name in args.names or DEFAULT_MODELS:
        if name not in DEFAULT_MODELS:
            raise UsageError(f"unknown default model {name!r}; choose from {', '.join(DEFAULT_MODELS)}")
        print(fetch_default(DEFAULT_MODELS[name]))
    return 0


def cmd_rpc_worker(args) -> int:
    """A llama.cpp RPC worker on --host:--port until stopped: llama.cpp's server in a
    child process behind a guard (backends/rpc_front.py), or with --unguarded on the
    port itself, in a thread so that Ctrl-C and SIGTERM, which Python handles in the
    main thread, still end it."""
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be 1..65535, got {args.port}")
    if not args.timeout > 0:
        raise UsageError(f"--timeout must be > 0, got {args.timeout:g}")
    key = args.rpc_key if args.rpc_key is not None else os.environ.get("SPECSAMPLE_RPC_KEY") or None
    if args.unguarded and key is not None:
        raise UsageError("--rpc-key needs the guard: drop --unguarded")
    # Its threads sleep between graphs instead of spinning: the other workers on this
    # machine (and the client) run while it waits. Read when llama.cpp loads, below.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from .backends.models import cache_dir
    from .backends.rpc import KEYED_NOTE, TRUST_WARNING, serve_worker

    threads = args.threads or os.cpu_count() or 1
    cache = cache_dir() / "rpc" if args.cache else None
    if not args.unguarded:
        from .backends.rpc_front import run

        note = f"key required; {KEYED_NOTE}" if key is not None else f"warning: {TRUST_WARNING}"
        print(f"specsample: RPC worker on {args.host}:{args.port}, {threads} threads, guarded; {note}",
              file=sys.stderr, flush=True)
        run(args.host, args.port, threads, args.mem, cache, args.timeout, key)
        return 0
    failed: list[BaseException] = []

    def run():
        try:
            serve_worker(args.host, args.port, threads, args.mem, cache)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failed.append(e)

    worker = threading.Thread(target=run, daemon=True, name="rpc-worker")
    worker.start()
    print(f"specsample: RPC worker on {args.host}:{args.port}, {threads} threads, unguarded; warning: {TRUST_WARNING}",
          file=sys.stderr, flush=True)
    while worker.is_alive():
        worker.join(0.5)
    if failed:
        raise failed[0]
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with sigterm_as_exit():
        try:
            code = args.func(args)
            sys.stdout.flush()  # a closed pipe fails here, not in the interpreter's exit
            return code
        except BrokenPipeError:
            return stdout_closed()
        # What a user can cause: bad input, a missing or unreachable model (OSError from
        # transformers), a full disk, an engine failure (RuntimeError from llama_decode),
        # numbers or types a hand-edited cache file holds (ArithmeticError, TypeError).
        except (UsageError, ModelError, ValueError, OSError, RuntimeError, ArithmeticError, TypeError) as e:
            print(f"specsample: error: {one_line(e)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            return 130


@contextlib.contextmanager
def sigterm_as_exit():
    """SIGTERM (a job scheduler, `kill`, a container stopping) raises SystemExit(143)
    in the main thread, so cleanup runs as on Ctrl-C: the bench stops the servers it
    started and removes its temporary files. Python's default would end the process
    at once, leaving child processes running."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; a library caller keeps its own
        return

    def exit_(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def one_line(error: BaseException) -> str:
    # transformers' hub errors run to several lines of advice
    return " ".join(str(error).split()) or type(error).__name__


def stdout_closed() -> int:
    """`specsample generate ... | head`: the reader left, so stop quietly. The recipe of
    Python's signal docs: point stdout at devnull so the interpreter's last flush cannot
    fail again, and exit 1, as Python itself does on EPIPE."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


if __name__ == "__main__":
    sys.exit(main())
