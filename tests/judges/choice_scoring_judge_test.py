#!/usr/bin/env python3
"""transformers as the judge of `meshtrain eval --task` (train/choice_scoring.h): the scores
lm-evaluation-harness's HF backend computes, on the model meshtrain exports.

A Llama trained by meshtrain on text of its own Llama 3 style tokenizer.json (a byte-level BPE,
so that the harness's token split matters: a choice's tokens are those of context + choice past
the context's, and a context's trailing space moves to the choice), exported with its tokenizer.
The judge: AutoTokenizer and AutoModelForCausalLM (float64) on the export, and the harness's
HFLM loglikelihood rule written here (encode without special tokens, _encode_pair, the left cut
to max_length + 1 tokens, log_softmax summed over the continuation), acc and acc_norm from the
sums. meshtrain's per-choice log-likelihoods (fp64, tp 2 x pp 2) within 1e-4 (fp64 gives ~1e-12)
and the same acc and acc_norm, on a request-form file and a HellaSwag-form file.

lm-evaluation-harness itself is not installed: it pulls datasets, pyarrow, pandas, evaluate,
scikit-learn, sacrebleu and more into the pinned environment (see docs/running.md); its HFLM
rule is short and is written out here instead.

Runs in the judges' environment (scripts/judges.py run): CTest label `judge`.
"""
import json
import os
import re
import sys

import numpy as np
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "checkpoint"))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
sys.path.insert(0, os.path.join(HERE, "..", "io"))
sys.path.insert(0, os.path.join(HERE, "..", "train"))
sys.path.insert(0, HERE)
import harness  # noqa: E402
from hf_judge_test import SEQ, llama3_style_tokenizer, rotary_in_float64, float64_for_float32  # noqa: E402
from choice_scoring_test import HELLASWAG, hellaswag_doc, request_doc  # noqa: E402

REQUESTS = [
    {"context": "The cat sat on the", "choices": [" mat.", " hat.", " moon and the stars."], "gold": 0},
    {"context": "The dog ran to the ", "choices": ["mat.", "cat", "park and back"], "gold": 1},
    {"context": "The " * 60 + "cat", "choices": [" sat", " sat on the mat."], "gold": 1},
]


def judge_loglikelihood(model, tok, context, continuation):
    """lm-evaluation-harness's HFLM: _encode_pair, the left cut, summed log_softmax."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok.encode(context + continuation, add_special_tokens=False)
    ctx = tok.encode(context, add_special_tokens=False)
    cont = whole[len(ctx):]
    inp = (ctx + cont)[-(SEQ + 1):][:-1]
    with torch.no_grad(), float64_for_float32():
        logits = model(input_ids=torch.tensor([inp])).logits[0]
    logp = torch.log_softmax(logits, dim=-1)[len(inp) - len(cont):]
    return float(sum(logp[i, t] for i, t in enumerate(cont)))


class TransformersJudgesChoiceScoring(harness.Case):
    def test_llama_with_its_tokenizer(self):
        corpus = os.path.join(self.dir, "corpus.txt")
        text = "The cat sat on the mat. The dog ran to the park and back. " * 400
        with open(corpus, "w") as f:
            f.write(text)
        tok_dir = os.path.join(self.dir, "tok")
        size = llama3_style_tokenizer(tok_dir, text)
        tok_json = os.path.join(tok_dir, "tokenizer.json")
        data = os.path.join(self.dir, "data")
        self.meshtrain(["prepare", corpus, "--out", data, "--tokenizer", tok_json, "--val-fraction", "0.1"])
        deck = os.path.join(self.dir, "tok.toml")
        sections = {
            "run": {"device": '"cpu"', "name": '"tok"', "dir": f'"{self.run_dir}"', "seed": 3},
            "model": {"family": '"llama"', "layers": 2, "d_model": 32, "heads": 4, "kv_heads": 2,
                      "ffn_hidden": 48, "seq_len": SEQ, "vocab_size": (size + 3) // 4 * 4},
            "data": {"train": f'"{data}_train.bin"', "val": '"none"', "tokenizer": f'"{tok_json}"'},
            "train": {"precision": '"fp64"', "steps": 6, "global_batch": 8, "micro_batch": 2,
                      "lr": 3e-3, "warmup_steps": 1, "eval_every": 0},
            "checkpoint": {"every": 6}}
        with open(deck, "w") as f:
            for section, keys in sections.items():
                f.write(f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()))
        self.meshtrain(["train", deck], ranks=2)
        out = os.path.join(self.dir, "exported")
        self.meshtrain(["export", self.ckpt(6), "--format", "hf", out, "--tokenizer", tok_json])
        tok = transformers.AutoTokenizer.from_pretrained(out)
        model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64)
        rotary_in_float64(model)
        model.eval()

        files = {"requests": (REQUESTS, [request_doc(d) for d in REQUESTS]),
                 "hellaswag": (HELLASWAG, [hellaswag_doc(d) for d in HELLASWAG])}
        args = ["eval", deck, "--checkpoint", self.ckpt(6), "--set", "parallel.tp=2", "--set",
                "parallel.pp=2", "--per-choice", os.path.join(self.dir, "pc.jsonl")]
        for name, (rows, _) in files.items():
            path = os.path.join(self.dir, name + ".jsonl")
            with open(path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            args += ["--task", path]
        _, printed, _ = self.meshtrain(args, ranks=4)
        ours = {}
        with open(os.path.join(self.dir, "pc.jsonl")) as f:
            for r in map(json.loads, f):
                ours[(r["task"], r["example"], r["choice"])] = r["loglikelihood"]
        for name, (_, docs) in files.items():
            correct = correct_norm = 0
            for e, d in enumerate(docs):
                lls = [judge_loglikelihood(model, tok, d["context"], c) for c in d["continuations"]]
                for k, ll in enumerate(lls):
                    self.assertLess(abs(ours[(name, e, k)] - ll), 1e-4, f"{name} example {e} choice {k}")
                correct += int(np.argmax(lls)) == d["gold"]
                correct_norm += int(np.argmax(np.array(lls) / np.array(d["lengths"]))) == d["gold"]
            m = re.search(rf"^task {name}: acc \S+ \((\d+)/(\d+)\) acc_norm \S+ \((\d+)/", printed, re.M)
            self.assertIsNotNone(m, printed)
            self.assertEqual((int(m.group(1)), int(m.group(3)), int(m.group(2))),
                             (correct, correct_norm, len(docs)), name)
            print(f"\n{name}: acc {correct}/{len(docs)}, acc_norm {correct_norm}/{len(docs)} (transformers and meshtrain)")


if __name__ == "__main__":
    harness.main()
