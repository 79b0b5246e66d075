#!/usr/bin/env python3
"""parallel/ sees a model only through the pipeline-stage interface (model/pipeline_stage.h):
of model/ its sources may include only the headers that describe any model family (the stage,
its hooks and micro-batches, parameters and their store, deferred weight gradients, the
recompute mode), never a family's assembly or layers (model/gpt.h, block.h, ...). A new family
then needs no change in parallel/.

usage: stage_boundary_test.py <source root>
"""
import os
import re
import sys

ALLOWED = {
    "pipeline_stage.h", "unit_hooks.h", "micro_batch.h", "layer.h", "parameter.h",
    "parameter_store.h", "weight_gradients.h", "recompute.h",
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"meshtrain/model/([^"]+)"')


def offending(root):
    found = []
    for folder in ("include/meshtrain/parallel", "src/parallel"):
        base = os.path.join(root, folder)
        for dirpath, _, names in os.walk(base):
            for name in sorted(names):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1) not in ALLOWED:
                            found.append("%s:%d includes meshtrain/model/%s" %
                                         (os.path.relpath(path, root), number, m.group(1)))
    return found


def main():
    root = sys.argv[1]
    if not os.path.isdir(os.path.join(root, "src", "parallel")):
        print("no src/parallel under %s (hint: pass the source root)" % root)
        return 2
    found = offending(root)
    for f in found:
        print(f)
    if found:
        print("parallel/ must see models only through model/pipeline_stage.h (allowed from model/: %s)"
              % ", ".join(sorted(ALLOWED)))
        return 1
    print("parallel/ includes only the model-family-neutral headers of model/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
