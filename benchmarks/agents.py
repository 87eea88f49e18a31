"""Agent and editor sessions (benchmarks/sessions.py) against servers, turn by turn:
each session's turns go in order to one server, so what that server has seen counts
(its prompt cache, its suffix index), and every session runs on every server, the
servers taking turns session by session in a rotating order (A B C, B C A, ...).

    python -m benchmarks.agents --threads 2 --out docs/results/agent-sessions \\
        [--kinds agent,tools,fim] [--sessions 2] [--turns 4] [--max-tokens 128] [--setting greedy]

Servers: `--servers plain,auto,suffix` starts `specsample serve --parallel 1` with
--autoregressive, with -k auto, and with -k auto --suffix-tokens N; `--url NAME=URL`
(repeatable) also asks endpoints already running (llama-server -md, say), after them;
with --url alone none is started. Per turn, from the client's clock:
time to the first streamed text or tool call, whole-request tokens/s (the answer's
tokens over the request's time, prefill included) and decode tokens/s (tokens after
the first over the time from the first to the last); from the server's `usage`: the
prompt tokens it held already, tokens per target call and drafts accepted where it
reports them. Per session kind and server: the same summed over the sessions' turns,
and the ratio of whole-request and decode tokens/s to the first server's (plain
decoding), and each later turn's time to first token over the first turn's.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.sessions import KINDS, Reply, make_sessions
from specsample.bench.load import rotation

SAMPLED = {"temperature": 0.8, "top_p": 0.95}  # the bench's "sample" setting (bench/modes.py)


@dataclass
class Server:
    name: str
    api_base: str  # ".../v1"
    model: str


@dataclass
class Turn:
    """One request of a session, as the client saw it and the server counted it."""

    server: str
    kind: str
    session: str
    turn: int  # 0-based
    side: bool  # a side request between turns, outside the session's figures
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    completion_tokens: int = 0
    ttft: float | None = None
    seconds: float = 0.0
    decode_seconds: float | None = None  # first text to last
    target_calls: int | None = None
    drafted: int | None = None
    accepted: int | None = None
    suffix_rounds: int | None = None  # rounds that drafted from the suffix index
    applied: bool | None = None  # the session took the model's own edit or call
    error: str | None = None


def body_for(server: Server, body: dict, setting: str, seed: int) -> dict:
    sampling = {"temperature": 0.0} if setting == "greedy" else dict(SAMPLED)
    return {"model": server.model, **body, **sampling, "seed": seed}


def send(server: Server, body: dict, timeout: float = 3600.0) -> tuple[Reply, dict]:
    """One streamed request (chat where the body has messages, else a completion):
    the reply and what the client timed and the stream's usage counted."""
    import httpx
    from openai import OpenAI

    http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=timeout)
    client = OpenAI(base_url=server.api_base, api_key="none", max_retries=0, timeout=timeout, http_client=http)
    chat = "messages" in body
    create = client.chat.completions.create if chat else client.completions.create
    reply, calls, usage, first, last = Reply(), {}, None, None, None
    sent = time.perf_counter()
    try:
        for chunk in create(**body, stream=True, stream_options={"include_usage": True}):
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta if chat else None
            text = (delta.content if chat else chunk.choices[0].text) or ""
            for call in (delta.tool_calls or []) if chat else []:
                name, arguments = calls.get(call.index, ("", ""))
                calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
            if text or (chat and delta.tool_calls):
                now = time.perf_counter()
                first, last = first or now, now
                reply.text += text
    finally:
        client.close()
    reply.tool_calls = [calls[i] for i in sorted(calls)]
    end = time.perf_counter()
    return reply, {"ttft": None if first is None else first - sent, "seconds": end - sent,
                   "decode_seconds": None if first is None else last - first, **usage_counts(usage)}


def usage_counts(usage) -> dict:
    """The stream's usage as Turn fields: token counts, and our `speculative` extension's."""
    if usage is None:
        return {"error": "the stream carried no usage"}
    details = usage.prompt_tokens_details
    spec = (usage.model_extra or {}).get("speculative") or {}
    sources = spec.get("sources") or {}
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "cached_tokens": None if details is None else details.cached_tokens,
            "target_calls": spec.get("target_calls"), "drafted": spec.get("drafted"),
            "accepted": spec.get("accepted"),
            "suffix_rounds": sum(v["rounds"] for k, v in sources.items() if k.startswith("suffix")) if spec else None}


def run_sessions(servers: list[Server], sessions: list, turns: int, setting: str, send=send, log=None,
                 keep=lambda records: None) -> list[Turn]:
    """Every session on every server, its turns in order; session i visits the servers
    starting at the i-th (mod their number). Each server gets a fresh copy of the session.
    `keep` sees the records so far after every turn (a run cut short keeps them)."""
    log = log or (lambda msg: print(f"agents: {msg}", file=sys.stderr, flush=True))
    records = []
    for i, template in enumerate(sessions):
        for server in rotation(servers, i):
            session = copy.deepcopy(template)
            for t in range(turns):
                side = session.side_body() if hasattr(session, "side_body") else None
                if side is not None:
                    records.append(_request(server, session, t, body_for(server, side, "greedy", 0), True, send)[1])
                reply, turn = _request(server, session, t, body_for(server, session.body(), setting, 1000 * i + t),
                                       False, send)
                session.observe(reply)
                turn.applied = session.applied[-1] if session.applied else None
                records.append(turn)
                keep(records)
                log(f"{server.name} {session.id} turn {t + 1}: {turn.completion_tokens} tokens in {turn.seconds:.1f} s, "
                    f"TTFT {turn.ttft or 0:.2f} s, cached {turn.cached_tokens} of {turn.prompt_tokens}")
    return records


def _request(server: Server, session, t: int, body: dict, side: bool, send) -> tuple[Reply, Turn]:
    turn = Turn(server.name, session.kind, session.id, t, side)
    try:
        reply, measured = send(server, body)
    except Exception as e:  # an unanswered turn is reported, and the session goes on as if it were empty
        turn.error = f"{type(e).__name__}: {e}"
        return Reply(), turn
    for key, value in measured.items():
        setattr(turn, key, value)
    return reply, turn


# ---- the report ----

def _ratio(a, b):
    return a / b if a is not None and b else None


def summarise(records: list[Turn]) -> list[dict]:
    """One row per (kind, server), in the order they first appear: the session turns'
    sums and the ratios to the first server's row of the kind."""
    rows, groups = [], {}
    for r in records:
        if not r.side and r.error is None:
            groups.setdefault((r.kind, r.server), []).append(r)
    first_of_kind = {}
    for (kind, server), group in groups.items():
        tokens = sum(r.completion_tokens for r in group)
        decode = sum(r.decode_seconds or 0 for r in group)
        calls = [r for r in group if r.target_calls]
        drafted = sum(r.drafted or 0 for r in group)
        ttft_ratios = []
        for session in dict.fromkeys(r.session for r in group):
            turns = sorted((r for r in group if r.session == session), key=lambda r: r.turn)
            if turns[0].turn == 0 and turns[0].ttft and len(turns) > 1:
                ttft_ratios.append(max(r.ttft or 0 for r in turns[1:]) / turns[0].ttft)
        seconds = sum(r.seconds for r in group)
        row = {"kind": kind, "server": server, "sessions": len({r.session for r in group}), "turns": len(group),
               "tokens": tokens, "tok_s": tokens / seconds,
               # the share of the requests' time spent before their first token: 1 / share is
               # the most any decoding speed could make of this row's whole-request tok/s
               "before_first": _ratio(sum(r.ttft or 0 for r in group), seconds),
               "decode_tok_s": _ratio(sum(max(r.completion_tokens - 1, 0) for r in group), decode),
               "ttft_first": _mean([r.ttft for r in group if r.turn == 0]),
               "ttft_later": _mean([r.ttft for r in group if r.turn > 0]),
               "ttft_later_over_first_max": max(ttft_ratios) if ttft_ratios else None,
               "tokens_per_call": _ratio(sum(r.completion_tokens for r in calls), sum(r.target_calls for r in calls)),
               "acceptance": _ratio(sum(r.accepted or 0 for r in group), drafted),
               "suffix_rounds": sum(r.suffix_rounds or 0 for r in group),
               "own_edits": sum(bool(r.applied) for r in group)}
        base = first_of_kind.setdefault(kind, row)
        row["x_tok_s"], row["x_decode"] = _ratio(row["tok_s"], base["tok_s"]), _ratio(row["decode_tok_s"],
                                                                                       base["decode_tok_s"])
        rows.append(row)
    return rows


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _f(value, digits=2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[dict]) -> list[str]:
    out = ["| kind | server | sessions x turns | tokens | tok/s | x plain | decode tok/s | x plain | before 1st token | "
           "TTFT turn 1 s | TTFT later s | max later/turn 1 | tokens/target call | accepted | suffix rounds | "
           "model's own edits |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['kind']} | {r['server']} | {r['sessions']} x {r['turns'] // max(r['sessions'], 1)} | "
                   f"{r['tokens']} | {_f(r['tok_s'])} | {_f(r['x_tok_s'])} | {_f(r['decode_tok_s'])} | "
                   f"{_f(r['x_decode'])} | {_f(r['before_first'])} | {_f(r['ttft_first'])} | {_f(r['ttft_later'])} | "
                   f"{_f(r['ttft_later_over_first_max'])} | {_f(r['tokens_per_call'])} | {_f(r['acceptance'])} | "
                   f"{r['suffix_rounds']} | {r['own_edits']} |")
    return out


def turn_table(records: list[Turn]) -> list[str]:
    servers = list(dict.fromkeys(r.server for r in records))
    out = ["| session | turn | " + " | ".join(f"{s} TTFT s / tok/s / cached" for s in servers) + " |",
           "|---|---|" + "---|" * len(servers)]
    keys = list(dict.fromkeys((r.session, r.turn) for r in records if not r.side))
    by = {(r.session, r.turn, r.server): r for r in records if not r.side}
    for session, turn in keys:
        cells = []
        for s in servers:
            r = by.get((session, turn, s))
            cells.append("-" if r is None or r.error else
                         f"{_f(r.ttft)} / {_f(r.completion_tokens / r.seconds if r.seconds else None)} / "
                         f"{r.cached_tokens}")
        out.append(f"| {session} | {turn + 1} | " + " | ".join(cells) + " |")
    return out


# ---- the command ----

def start_servers(names: list[str], model_argv: list[str], suffix_tokens: int, trace: Path | None, stack) -> list:
    from benchmarks.serving import specsample_server

    flags = {"plain": ["--autoregressive"], "auto": ["-k", "auto"],
             "suffix": ["-k", "auto", "--suffix-tokens", str(suffix_tokens)]}
    servers = []
    for name in names:
        extra = [*flags[name], "--parallel", "1"]
        if trace is not None and name != "plain":
            trace.mkdir(parents=True, exist_ok=True)
            extra += ["--trace", str(trace / f"{name}.jsonl")]
        process = stack.enter_context(specsample_server(model_argv, extra, f"serve {' '.join(extra)}"))
        servers.append(Server(name, process.url + "/v1", process.request("/v1/models")["data"][0]["id"]))
    return servers


def main(argv: list[str] | None = None) -> int:
    import contextlib

    p = argparse.ArgumentParser(prog="python -m benchmarks.agents", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--kinds", default=",".join(KINDS), help="session kinds, comma-separated: agent, tools, fim")
    p.add_argument("--sessions", type=int, default=2, help="sessions of each kind (at most 4)")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--setting", choices=("greedy", "sample"), default="greedy")
    p.add_argument("--servers", default=None, help="servers to start, the first the baseline: plain "
                   "(--autoregressive), auto (-k auto), suffix (-k auto --suffix-tokens N); default all three, "
                   "none where --url is given")
    p.add_argument("--suffix-tokens", type=int, default=65536)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--ctx-size", type=int, default=8192)
    p.add_argument("--trace", type=Path, default=None, help="a folder: each drafting server's --trace file")
    p.add_argument("--url", action="append", default=[], metavar="NAME=URL",
                   help="also ask an endpoint already running, after the servers started (repeatable; "
                   "with --url alone, no server is started)")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if not set(kinds) <= set(KINDS) or not 1 <= args.sessions <= 4:
        p.error(f"--kinds takes {', '.join(KINDS)}; --sessions 1 to 4")
    command = "python -m benchmarks.agents " + " ".join(argv if argv is not None else sys.argv[1:])
    sessions = make_sessions(kinds, args.sessions, args.max_tokens)
    model_argv = ["--ctx-size", str(args.ctx_size), *(["--threads", str(args.threads)] if args.threads else [])]
    with contextlib.ExitStack() as stack:
        names = args.servers if args.servers is not None else "" if args.url else "plain,auto,suffix"
        names = [n for n in names.split(",") if n]
        if not set(names) <= {"plain", "auto", "suffix"}:
            p.error(f"--servers takes plain, auto, suffix; got {','.join(names)}")
        servers = start_servers(names, model_argv, args.suffix_tokens, args.trace, stack)
        if args.url:
            from specsample.bench.endpoints import connect, parse_endpoints

            servers += [Server(e.name, e.api_base, connect(e, "none").model) for e in parse_endpoints(args.url)]
        if not servers:
            p.error("no server: give --servers or --url")
        started = time.time()
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"sessions-{args.setting}-{'-'.join(kinds)}"
        partial = args.out / f"{stem}.partial.json"  # the turns so far, replaced by the report at the end
        records = run_sessions(servers, sessions, args.turns, args.setting, keep=lambda done: partial.write_text(
            json.dumps({"command": command, "turns": [asdict(r) for r in done]}, indent=1)))
    partial.unlink(missing_ok=True)
    rows = summarise(records)
    report = "\n".join([f"Command: `{command}`", "", f"{args.sessions} sessions of each kind x {args.turns} turns, "
                        f"{args.setting}, {args.max_tokens} tokens at most; servers {', '.join(s.name for s in servers)}"
                        f" (x plain: over the first); run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}.",
                        "", "before 1st token: the share of the requests' time spent before their first token; no "
                        "decoding speed can take a row's whole-request tok/s past 1 / that share of itself.",
                        "", *table(rows), "", "Per turn:", "", *turn_table(records), ""])
    (args.out / f"{stem}.md").write_text(report)
    (args.out / f"{stem}.json").write_text(json.dumps({"command": command, "rows": rows,
                                                       "turns": [asdict(r) for r in records]}, indent=1))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
