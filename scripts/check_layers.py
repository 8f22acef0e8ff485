#!/usr/bin/env python3
"""Checks that every #include follows the layer order of docs/ARCHITECTURE.md.

usage: check_layers.py SOURCE_ROOT

Each folder is one layer (and one CMake library); a file may include headers of its own layer
and of the layers below it, never above. The link step already refuses calls upward between
libraries; this check also catches an upward #include of a header-only piece, and says which
rule a file broke. Libraries' headers (absl, gRPC, oneDNN, the generated protobuf code) are below
everything. tests/, bench/, fuzz/ and cmd/ may include anything.
"""
import os
import re
import sys

# layer -> the layers it may include, besides itself (transitively closed below).
BELOW = {
    "common": [],
    "common/rpc": ["common"],
    "common/metrics": ["common"],
    "checkpoint": ["common"],
    "ps/store": ["checkpoint"],
    "ps/server": ["ps/store", "common/rpc", "common/metrics"],
    "worker/data": ["common"],
    "worker/model": ["common"],
    "worker/params": ["worker/model", "ps/store"],
    "worker/eval": ["worker/params", "worker/data"],
    "worker/train": ["worker/eval", "checkpoint", "common/metrics"],
    "worker/ps_client": ["worker/train", "common/rpc"],
    "worker/allreduce": ["worker/train"],
    "worker/tools": ["worker/eval", "worker/data"],
    "worker/tune": ["worker/train", "worker/tools"],
    "serving": ["worker/eval", "checkpoint"],
    "serving/server": ["serving", "common/rpc", "common/metrics"],
}
UNRESTRICTED = ("cmd", "tests", "bench", "fuzz")
# Our top folders; includes of anything else (absl/, grpcpp/, oneapi/, the generated protobuf
# headers pstrain/, tensorflow/, ...) are libraries below every layer.
OURS = {"common", "checkpoint", "ps", "worker", "serving", "cmd", "tests", "bench", "fuzz"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def closure(layer, seen=None):
    seen = set() if seen is None else seen
    if layer in seen:
        return seen
    seen.add(layer)
    for below in BELOW.get(layer, []):
        closure(below, seen)
    return seen


def layer_of(path):
    """The most specific layer whose folder holds `path` (relative to the root)."""
    best = None
    for layer in BELOW:
        if path.startswith(layer + "/") and (best is None or len(layer) > len(best)):
            best = layer
    return best


def main():
    root = sys.argv[1]
    problems, checked = [], 0
    for top in sorted({l.split("/")[0] for l in BELOW} | set(UNRESTRICTED)):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in names:
                if not name.endswith((".h", ".cc", ".inc")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                if rel.startswith(UNRESTRICTED):
                    continue
                layer = layer_of(rel)
                if layer is None:
                    problems.append(f"{rel}: in no layer of scripts/check_layers.py (add its folder)")
                    continue
                allowed = closure(layer)
                text = open(os.path.join(root, rel), encoding="utf-8").read()
                for inc in INCLUDE.findall(text):
                    if inc.split("/")[0] not in OURS:
                        continue  # a library's header (absl/, grpcpp/, oneapi/, ...)
                    checked += 1
                    target = layer_of(inc)
                    if target is None:
                        if inc.startswith(tuple(l + "/" for l in UNRESTRICTED)):
                            problems.append(f"{rel}: includes {inc}, a file of {inc.split('/')[0]}/")
                        else:
                            problems.append(f"{rel}: includes {inc}, which is in no layer")
                    elif target not in allowed:
                        problems.append(f"{rel} ({layer}) includes {inc} ({target}): "
                                        f"{layer} may include only {', '.join(sorted(allowed))}")
    if problems:
        print("\n".join(problems))
        return 1
    print(f"{checked} includes in {len(BELOW)} layers follow the layer order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
