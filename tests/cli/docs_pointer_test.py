#!/usr/bin/env python3
"""Refusals and --help name the docs page that explains them (src/app/docs_page.cpp).

A refusal of each kind, through the real binary: the message is printed once, then
"meshtrain: more in docs/PAGE.md", the page the message's topic belongs to, and that page exists.
Every sub-command's --help ends with the pages that explain it, and those exist too.

usage: docs_pointer_test.py MESHTRAIN REPO
"""
import os
import re
import subprocess
import sys
import tempfile

BIN, REPO = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
problems = []


def run(args, cwd):
    return subprocess.run([BIN] + args, cwd=cwd, capture_output=True, text=True, timeout=300)


def check_refusal(name, args, page, cwd):
    p = run(args, cwd)
    out = p.stdout + p.stderr
    pointers = re.findall(r"^meshtrain: more in (\S+)$", out, re.M)
    if p.returncode == 0:
        problems.append(f"{name}: exit 0, expected a refusal")
    if out.count("error:") != 1:
        problems.append(f"{name}: 'error:' printed {out.count('error:')} times, expected once")
    if pointers != [page]:
        problems.append(f"{name}: pointers {pointers}, expected [{page!r}]:\n{out}")
    for named in pointers:
        if not os.path.isfile(os.path.join(REPO, named)):
            problems.append(f"{name}: {named} does not exist")
    print(f"{name}: exit {p.returncode}, pointers {pointers}")


with tempfile.TemporaryDirectory(prefix="meshtrain-docs-pointer-") as tmp:
    deck = os.path.join(tmp, "deck.toml")
    with open(deck, "w") as f:
        f.write("[model]\nlayer = 4\n")
    check_refusal("unknown deck key", ["plan", deck, "--world", "1"], "docs/deck-reference.md", tmp)
    check_refusal("layout", ["plan", os.path.join(REPO, "input", "gpt.toml"), "--world", "5",
                             "--set", "parallel.tp=5"], "docs/parallelism-and-schedules.md", tmp)
    check_refusal("prepare input", ["prepare", "--out", "x", "missing.txt"],
                  "docs/data-and-interop.md", tmp)
    check_refusal("inspect", ["inspect", "missing.h5"], "docs/checkpoints.md", tmp)

    top = run(["--help"], tmp).stdout
    subs = re.findall(r"^  (\w+)\s{2,}\S", top.split("SUBCOMMANDS:")[-1], re.M)
    if len(subs) < 10:
        problems.append(f"meshtrain --help lists {subs}: expected every sub-command")
    for sub in [None] + subs:
        p = run(([sub] if sub else []) + ["--help"], tmp)
        pages = re.findall(r"docs/[\w-]+\.md", p.stdout)
        where = f"meshtrain {sub or ''} --help".replace("  ", " ")
        if p.returncode != 0 or not pages:
            problems.append(f"{where}: exit {p.returncode}, names no docs page:\n{p.stdout[-400:]}")
        for page in pages:
            if not os.path.isfile(os.path.join(REPO, page)):
                problems.append(f"{where}: names {page}, which does not exist")
        print(f"{where}: {sorted(set(pages))}")

if problems:
    print("\nFAILED:\n" + "\n".join(problems))
    sys.exit(1)
print("every refusal and --help names an existing docs page")
