#!/usr/bin/env python3
"""The training core sees a model only through the pipeline-stage interface
(model/pipeline_stage.h), so that a new model family is a new folder, not a change there:

1. parallel/'s own includes of model/ are only the headers that describe any model family (the
   stage, its hooks and micro-batches, parameters and their store, deferred weight gradients,
   the recompute mode), never a family's assembly or layers (model/decoder_model.h, block.h, ...).
2. No source or header of parallel/, checkpoint/ or train/ reaches, following includes
   transitively (project headers, "meshtrain/..." and the folder's own "x.h"), a family's or a
   mixture of experts' headers: include/meshtrain/families/*, model/moe_*, model/expert_*. The
   expert bias, the expert loads and whatever a family brings reach them as the stage's named
   buffers and step statistics. A failure prints the chain of includes that gets there.

usage: stage_boundary_test.py <source root>
"""
import os
import re
import sys

ALLOWED = {
    "pipeline_stage.h", "unit_hooks.h", "micro_batch.h", "layer.h", "parameter.h",
    "parameter_store.h", "weight_gradients.h", "recompute.h", "token_shape.h",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
MODEL_INCLUDE = re.compile(r'^meshtrain/model/(.+)$')
CORE = ("parallel", "checkpoint", "train")


def sources(root, folder):
    for base in (os.path.join(root, "include", "meshtrain", folder), os.path.join(root, "src", folder)):
        for dirpath, _, names in os.walk(base):
            for name in sorted(names):
                yield os.path.join(dirpath, name)


def includes(path):
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                yield number, m.group(1)


def direct_offenders(root):
    found = []
    for path in sources(root, "parallel"):
        for number, target in includes(path):
            m = MODEL_INCLUDE.match(target)
            if m and m.group(1) not in ALLOWED:
                found.append("%s:%d includes meshtrain/model/%s" % (os.path.relpath(path, root), number, m.group(1)))
    return found


def resolve(root, including, target):
    """The file an #include "target" names: a project header, or one beside the includer."""
    if target.startswith("meshtrain/"):
        path = os.path.join(root, "include", target)
    else:
        path = os.path.join(os.path.dirname(including), target)
    return os.path.normpath(path) if os.path.isfile(path) else None


def forbidden(root, path):
    rel = os.path.relpath(path, os.path.join(root, "include", "meshtrain")).replace(os.sep, "/")
    name = os.path.basename(path)
    return rel.startswith("families/") or (
        rel.startswith("model/") and (name.startswith("moe_") or name.startswith("expert_")))


def transitive_offenders(root):
    edges = {}

    def targets(path):
        if path not in edges:
            edges[path] = [r for r in (resolve(root, path, t) for _, t in includes(path)) if r]
        return edges[path]

    found = []
    for folder in CORE:
        for start in sources(root, folder):
            parent = {start: None}
            queue = [start]
            hit = None
            while queue and hit is None:  # breadth first: the shortest chain
                current = queue.pop(0)
                for nxt in targets(current):
                    if nxt in parent:
                        continue
                    parent[nxt] = current
                    if forbidden(root, nxt):
                        hit = nxt
                        break
                    queue.append(nxt)
            if hit is not None:
                chain = []
                while hit is not None:
                    chain.append(os.path.relpath(hit, root))
                    hit = parent[hit]
                found.append(" -> ".join(reversed(chain)))
    return found


def report(found, requirement):
    for line in found:
        print(line)
    if found:
        print(requirement)
    return 1 if found else 0


def main():
    root = sys.argv[1]
    if not os.path.isdir(os.path.join(root, "src", "parallel")):
        print("no src/parallel under %s (hint: pass the source root)" % root)
        return 2
    status = report(direct_offenders(root),
                    "parallel/ must see models only through model/pipeline_stage.h (allowed from model/: %s)"
                    % ", ".join(sorted(ALLOWED)))
    status |= report(transitive_offenders(root),
                     "%s/ must reach no family's or mixture of experts' header (families/*, model/moe_*, "
                     "model/expert_*), not even through other headers: go through model/pipeline_stage.h"
                     % "/, ".join(CORE))
    if status == 0:
        print("parallel/ includes only the model-family-neutral headers of model/; parallel/, "
              "checkpoint/ and train/ reach no family's or MoE's header")
    return status


if __name__ == "__main__":
    sys.exit(main())
