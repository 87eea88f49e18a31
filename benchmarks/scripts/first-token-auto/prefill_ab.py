"""Is -k auto's prefill slower than plain decoding's in the same process? One process,
the default Q4_K_M pair, chat prompts of the bench (default: a 572-token extraction),
one new token each (the first token is the prefill's last row), the two modes
alternating, their order turned each repetition. Per run: the prefill's seconds, the
CPU ticks of each of the process's threads and the machine's steal and idle ticks over
it, so a thread of ours that competes with the target's two, or a hypervisor taking the
cores, would show.

    PYTHONPATH=src python benchmarks/scripts/first-token-auto/prefill_ab.py REPS [PROMPT_ID ...]

What it showed (2026-12-07, 2-core AMD EPYC, alone under the lock, main at b654b62).
The chat bench of docs/results/chat-q4_k_m-26 had `-k auto` 7.2 s slower than plain
before the first token over 26 prompts, and a first run of this script (two prompts,
572 and 1,103 tokens, 4 repetitions, without the tick columns) had it slower in 7 of 8
pairs, median 1.11x. Then 10 repetitions on the 572-token prompt: slower in 2 of 10,
median 0.979x (0.782-1.039). In every run the same two threads (the caller and one
OpenMP worker) used the whole prefill's ticks, the others 2-4 ticks; the CPU time grew
with the wall time (the same prefill took 11.3 to 17.8 s), so the spread is the cores'
rate on this virtual machine, not work or waiting that `-k auto` adds: its prefill is
the plain loop's call (generate._prefill) and no draft call runs before it.
"""
import os, statistics, sys, time

from specsample.app.assemble import ModelOptions, assemble
from specsample.bench.tasks import chat_prompts
from specsample.decoding.generate import GenerationConfig, generate
from specsample.decoding.sampling import SamplingConfig


def thread_ticks() -> dict[str, tuple[str, int]]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = open(f"/proc/self/task/{tid}/stat").read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[tid] = (stat[stat.index("(") + 1:stat.rindex(")")], int(fields[11]) + int(fields[12]))
    return out


def machine_ticks() -> list[int]:  # user nice system idle iowait irq softirq steal
    return [int(x) for x in open("/proc/stat").readline().split()[1:9]]


G = SamplingConfig(temperature=0)
models = assemble(ModelOptions(threads=2), drafting=True)
policy, target = models.policy("auto"), models.target
wanted = sys.argv[2:] or ["extraction-cmd"]
prompts = {p.id: target.tokenizer.chat_prompt(p.text) for p in chat_prompts() if p.id in wanted}
times = {"ar": [], "auto": []}
for rep in range(int(sys.argv[1])):
    for pid, ids in prompts.items():
        for mode in (("ar", "auto") if rep % 2 == 0 else ("auto", "ar")):
            cfg = GenerationConfig(max_new_tokens=1, sampling=G)
            machine, threads = machine_ticks(), thread_ticks()
            r = generate(target, ids, cfg) if mode == "ar" else generate(target, ids, cfg, models.drafter(G), policy)
            machine = [b - a for a, b in zip(machine, machine_ticks())]
            after = thread_ticks()
            used = sorted(((after[t][1] - threads.get(t, ("", 0))[1], t) for t in after), reverse=True)
            times[mode].append(r.stats.prefill_seconds)
            print(f"{rep} {pid} {len(ids)} tokens {mode}: prefill {r.stats.prefill_seconds:.2f} s; machine steal "
                  f"{machine[7]} idle {machine[3]} ticks; thread ticks {' '.join(f'{t}={n}' for n, t in used if n)}",
                  flush=True)
pairs = [a / b for a, b in zip(times["auto"], times["ar"])]
print("auto / ar prefill, paired:", " ".join(f"{x:.3f}" for x in pairs), "median", f"{statistics.median(pairs):.3f};",
      "auto slower in", sum(x > 1 for x in pairs), "of", len(pairs))
