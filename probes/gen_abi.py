#!/usr/bin/env python3
"""The probes' ABI for user space, generated from a BPF object's BTF at build time (make -C probes):

    bpftool -j btf dump file pathprof.bpf.o format raw | python3 gen_abi.py > abi.json

Writes the enums (constant name -> value) and the layout of every `pp_*` struct (member name, byte offset,
kind, size, element type and count for arrays), so pathprof.agent.probing.bpf.layout builds its ctypes mirrors
and name tables from what clang compiled, never from a hand-written copy. Standard library only: it runs
before the virtualenv exists."""
import json
import sys

PREFIXES = ("pp_",)
SKIP = ("TYPEDEF", "CONST", "VOLATILE", "RESTRICT", "TYPE_TAG")


def main() -> int:
    types = {t["id"]: t for t in json.load(sys.stdin)["types"]}

    def resolve(tid: int) -> dict:
        t = types.get(tid)
        while t and t["kind"] in SKIP:
            t = types.get(t["type_id"])
        if t is None:
            raise SystemExit(f"gen_abi: type {tid} not in the BTF")
        if t["kind"] in ("INT", "ENUM", "ENUM64"):
            signed = t.get("encoding") == "SIGNED" or bool(t.get("encoding") == "SIGNED")
            return {"kind": "int", "size": t["size"], "signed": signed}
        if t["kind"] == "ARRAY":
            return {"kind": "array", "count": t["nr_elems"], "elem": resolve(t["type_id"])}
        if t["kind"] == "STRUCT":
            return {"kind": "struct", "name": t["name"]}
        raise SystemExit(f"gen_abi: member of kind {t['kind']} is not supported (type {tid})")

    enums, structs = {}, {}
    for t in types.values():
        name = t.get("name") or ""
        if t["kind"] in ("ENUM", "ENUM64") and name.startswith(PREFIXES):
            enums[name] = {v["name"]: v["val"] for v in t["values"]}
        elif t["kind"] == "STRUCT" and name.startswith(PREFIXES):
            members = []
            for m in t["members"]:
                if m["bits_offset"] % 8 or m.get("bitfield_size"):
                    raise SystemExit(f"gen_abi: {name}.{m['name']} is a bit field; mirrors need whole bytes")
                members.append({"name": m["name"], "offset": m["bits_offset"] // 8, **resolve(m["type_id"])})
            structs[name] = {"size": t["size"], "members": members}
    json.dump({"enums": enums, "structs": structs}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
