#!/usr/bin/env python3
"""Regenerates the deck reference in docs/deck-reference.md from the binary's schema (`meshtrain keys`).

usage: scripts/update-readme-keys.py [BUILD_DIR]     (default: build)
       scripts/update-readme-keys.py --check BINARY PAGE   (exit 1 if PAGE is out of date)

(The name is older than the page: the reference used to live in README.md.)
"""
import os
import subprocess
import sys

BEGIN, END = "<!-- keys:begin -->", "<!-- keys:end -->"
PAGE = os.path.join("docs", "deck-reference.md")


def rendered(binary, readme_text):
    keys = subprocess.run([binary, "keys"], check=True, capture_output=True, text=True).stdout
    head, rest = readme_text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + keys.strip("\n") + "\n" + END + tail


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        text = open(sys.argv[3]).read()
        if rendered(sys.argv[2], text) != text:
            print(f"{sys.argv[3]}: the deck reference differs from `meshtrain keys`: "
                  "run scripts/update-readme-keys.py")
            sys.exit(1)
        print(f"{sys.argv[3]}: the deck reference is up to date")
        sys.exit(0)
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    text = open(PAGE).read()
    new = rendered(build + "/meshtrain", text)  # before opening the page for writing
    open(PAGE, "w").write(new)
