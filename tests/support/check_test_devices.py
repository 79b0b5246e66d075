#!/usr/bin/env python3
"""Fails when a test could silently change device on a GPU host, or precision on a CPU.

`run.device = "auto"` picks the GPU wherever there is one, and with it bf16 precision: a test
whose expectations are CPU numbers (fp32 tolerances, bitwise restarts, exact losses) would then
compare bf16 GPU results against them. Likewise `train.precision = "auto"` on the CPU is bf16
where the CPU has bf16 instructions and fp32 elsewhere. So every test deck names its device, and
every deck on the CPU its precision:

  - decks in Python tests (triple-quoted strings with TOML sections) and .toml files under
    tests/ must set `device = "cpu"` or `device = "cuda"` in [run]; a deck meant for any device
    carries the line `# device-independent: <why>` (its assertions hold on CPU and GPU alike);
  - decks with `device = "cpu"` must set `precision` in [train], or carry the line
    `# precision-independent: <why>` (its assertions hold in fp32 and bf16 alike);
  - C++ tests that build a Config from defaults (`Config c;` never assigned from a helper,
    `Config{}`) or parse a deck must set `run.device = DeviceChoice::...` in the same file
    (tests/support's tiny_config pins the CPU for every test built on it), or carry the line
    `// device-independent: <why>` when they run nothing on a device.

usage: check_test_devices.py TESTS_DIR
"""
import os
import re
import sys

SECTION = re.compile(r"^\s*\[(run|model|train|data|parallel|checkpoint)\]\s*$", re.M)
PINNED = re.compile(r'^\s*device\s*=\s*"(cpu|cuda)"', re.M)
ANY_DEVICE = re.compile(r"^\s*#\s*device-independent:\s*\S", re.M)
ANY_PRECISION = re.compile(r"^\s*#\s*precision-independent:\s*\S", re.M)
NAMED_PRECISION = re.compile(r'^\s*precision\s*=\s*"(fp32|fp64|bf16)"', re.M)
TRIPLE = re.compile(r'("""|\'\'\')(.*?)\1', re.S)
CPP_DECLARED = re.compile(r"\bConfig\s+(\w+)\s*;")
CPP_FRESH = re.compile(r"\bConfig\s*\{\s*\}|\bConfig\s*\(\s*\)|\bparse_deck\s*\(")
CPP_PINNED = re.compile(r"run\.device\s*=\s*DeviceChoice::(Cpu|Cuda)\b")
CPP_ANY_DEVICE = re.compile(r"^\s*//\s*device-independent:\s*\S", re.M)


def section(deck, name):
    """The text of the deck's [name] section ('' if none)."""
    m = re.search(r"^\s*\[%s\]\s*$(.*?)(?=^\s*\[|\Z)" % name, deck, re.M | re.S)
    return m.group(1) if m else ""


def run_section(deck):
    return section(deck, "run")


def fresh_config(text):
    """The first place the C++ `text` makes a Config from defaults or a deck, or None. A declared
    `Config x;` that is later assigned (`x = tiny_config(...)`) starts from a helper instead."""
    for m in CPP_DECLARED.finditer(text):
        if not re.search(r"\b%s\s*=[^=]" % re.escape(m.group(1)), text):
            return m
    return CPP_FRESH.search(text)


def deck_problem(deck):
    if ANY_DEVICE.search(deck):
        return None
    pinned = PINNED.search(run_section(deck))
    if not pinned:
        return ('leaves run.device on "auto": set device = "cpu" (or "cuda") in [run], or mark the '
                'deck "# device-independent: <why>"')
    if pinned.group(1) == "cpu" and not ANY_PRECISION.search(deck) and \
            not NAMED_PRECISION.search(section(deck, "train")):
        return ('leaves train.precision on "auto" on the CPU (bf16 or fp32 by the CPU\'s '
                'instructions): set precision = "fp32" (or "fp64", "bf16") in [train], or mark '
                'the deck "# precision-independent: <why>"')
    return None


def check(root):
    problems = []
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if os.path.abspath(path) == os.path.abspath(__file__):
                continue
            rel = os.path.relpath(path, root)
            if name.endswith(".py"):
                text = open(path, encoding="utf-8").read()
                for m in TRIPLE.finditer(text):
                    if not SECTION.search(m.group(2)):
                        continue
                    line = text.count("\n", 0, m.start()) + 1
                    why = deck_problem(m.group(2))
                    if why:
                        problems.append("tests/%s:%d: deck %s" % (rel, line, why))
            elif name.endswith(".toml"):
                why = deck_problem(open(path, encoding="utf-8").read())
                if why:
                    problems.append("tests/%s: %s" % (rel, why))
            elif name.endswith((".cpp", ".h")):
                text = open(path, encoding="utf-8").read()
                m = fresh_config(text)
                if m and not CPP_PINNED.search(text) and not CPP_ANY_DEVICE.search(text):
                    line = text.count("\n", 0, m.start()) + 1
                    problems.append("tests/%s:%d: builds a Config (%s) without setting run.device "
                                    "= DeviceChoice::Cpu (or ::Cuda)" % (rel, line, m.group(0)))
    return problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    problems = check(root)
    for p in problems:
        print("FAILED: " + p)
    print("%d test deck(s) or config(s) leave the device or the CPU's precision on auto" % len(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
