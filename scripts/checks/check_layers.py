#!/usr/bin/env python3
# check_layers.py: common/ is arranged in folders by layer, each allowed to include only its own and
# lower layers. This check fails, naming file and line, on an include that reaches up, on a header of
# common/ included without its folder, and on a folder that is not in the order. docs/layout.md says
# what each folder holds; the order below is the one place that says which is lower.
import os
import re
import sys

ORDER = ["base", "ops", "comm", "schedule", "model", "parallel", "training", "pipeline", "planner"]

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
common = os.path.join(root, "common")
problems = []
folders = sorted(d for d in os.listdir(common) if os.path.isdir(os.path.join(common, d)))
loose = sorted(f for f in os.listdir(common) if os.path.isfile(os.path.join(common, f)))
for f in loose:
    problems.append(f"common/{f}: a file outside every layer folder (put it in one of {', '.join(ORDER)})")
for d in folders:
    if d not in ORDER:
        problems.append(f"common/{d}/: a folder that is not in the layer order of scripts/checks/check_layers.py")
headers = {}
for d in folders:
    for f in os.listdir(os.path.join(common, d)):
        headers[f] = d
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
for d in folders:
    if d not in ORDER:
        continue
    for f in sorted(os.listdir(os.path.join(common, d))):
        path = os.path.join(common, d, f)
        with open(path, encoding="utf-8") as text:
            for number, line in enumerate(text, 1):
                m = include.match(line)
                if not m:
                    continue
                target = m.group(1)
                if "/" not in target:
                    if target in headers:
                        problems.append(f"common/{d}/{f}:{number}: include \"{headers[target]}/{target}\", with its folder")
                    continue
                layer = target.split("/")[0]
                if layer in ORDER and ORDER.index(layer) > ORDER.index(d):
                    problems.append(f"common/{d}/{f}:{number}: {d} includes {target}, from the higher layer {layer}")
for p in problems:
    print(p)
if problems:
    print(f"{len(problems)} include(s) break the layers' order ({' < '.join(ORDER)})")
    sys.exit(1)
print(f"layers hold: {' < '.join(ORDER)} ({sum(1 for _ in headers)} files)")
