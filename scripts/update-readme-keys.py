#!/usr/bin/env python3
"""Regenerates the deck reference in README.md from the binary's schema (`meshtrain keys`).

usage: scripts/update-readme-keys.py [BUILD_DIR]     (default: build)
       scripts/update-readme-keys.py --check BINARY README   (exit 1 if README is out of date)
"""
import subprocess
import sys

BEGIN, END = "<!-- keys:begin -->", "<!-- keys:end -->"


def rendered(binary, readme_text):
    keys = subprocess.run([binary, "keys"], check=True, capture_output=True, text=True).stdout
    head, rest = readme_text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + keys.strip("\n") + "\n" + END + tail


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        text = open(sys.argv[3]).read()
        if rendered(sys.argv[2], text) != text:
            print("README.md's deck reference differs from `meshtrain keys`: "
                  "run scripts/update-readme-keys.py")
            sys.exit(1)
        print("README.md deck reference is up to date")
        sys.exit(0)
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    text = open("README.md").read()
    new = rendered(build + "/meshtrain", text)  # before opening README.md for writing
    open("README.md", "w").write(new)
