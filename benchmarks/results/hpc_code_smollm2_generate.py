"""Generation in chunks with incremental saves (the CLI's sampler, HFSampler.sample, with its settings):
argv: model out.jsonl max_new n chunk_problems part nparts models.  Problems of the selected execution models are
interleaved by type (one per type in turn), this process takes every nparts-th from part; after each chunk its
completions are appended as --completions lines (problem, completion, sample, raw body)."""
import json, sys, time, torch
from itertools import zip_longest
from hpc_codegen.generate import HFSampler
from hpc_codegen.problems import load_suite
from hpc_codegen.code_blocks import c_body_closed, extract_c_body
torch.set_num_threads(1)
model, out, max_new, n, chunk, part, nparts = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
models = sys.argv[8].split(",")
ps, _ = load_suite(None, None, models)
bytype = {}
for p in ps:
    bytype.setdefault((p.model, p.type), []).append(p)
order = [p for group in zip_longest(*bytype.values()) for p in group if p is not None]
mine = order[part::nparts]
print(len(mine), "prompts for this part", flush=True)
s = HFSampler(model, seed=0)
t0 = time.time()
for c in range(0, len(mine), chunk):
    ch = mine[c:c + chunk]
    texts = s.sample([p.prompt for p in ch], n, temperature=0.2, top_p=0.95, max_new_tokens=max_new,
                     batch_size=len(ch) * n, is_done=c_body_closed, progress=False,
                     languages=[p.language for p in ch], names=[p.name for p in ch])
    with open(out, "a") as f:
        for p, cs in zip(ch, texts):
            for j, t in enumerate(cs):
                f.write(json.dumps({"problem": p.name, "completion": t, "sample": j, "body": extract_c_body(t)}) + "\n")
    toks = [len(s.tok(t).input_ids) for cs in texts for t in cs]
    print(f"chunk {c // chunk}: {[p.name for p in ch]} done at t={time.time() - t0:.0f}s; {sum(toks)} tokens, "
          f"{sum(x >= max_new - 1 for x in toks)}/{len(toks)} at the cap", flush=True)
