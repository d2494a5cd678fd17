"""One handler per supported op: read the op's tokens, compute its value, record the tile op it costs."""

from __future__ import annotations

import math
import operator
import struct
from typing import Any

import torch

from spyre_lab.ktir.affine import parse_map, parse_set
from spyre_lab.ktir.errors import KTIRUnsupported
from spyre_lab.ktir.memory import AccessTile, MemoryView, Pointer, load, order_of, store
from spyre_lab.ktir.syntax import Op
from spyre_lab.ktir.types import shaped
from spyre_lab.ktir.values import Recorded, TVal

Core = Any  # spyre_lab.ktir.interpret.Core, which imports this module

INT_OPS = {
    "arith.addi": operator.add, "arith.subi": operator.sub, "arith.muli": operator.mul,
    "arith.divsi": lambda a, b: int(a / b), "arith.divui": operator.floordiv, "arith.floordivsi": operator.floordiv,
    "arith.ceildivsi": lambda a, b: -(-a // b), "arith.ceildivui": lambda a, b: -(-a // b),
    "arith.remsi": lambda a, b: int(math.fmod(a, b)), "arith.remui": operator.mod,
    "arith.minsi": min, "arith.maxsi": max, "arith.minui": min, "arith.maxui": max,
    "arith.andi": operator.and_, "arith.ori": operator.or_, "arith.xori": operator.xor,
}
FLOAT_OPS = {
    "arith.addf": torch.add, "arith.subf": torch.sub, "arith.mulf": torch.mul, "arith.divf": torch.div,
    "arith.maximumf": torch.maximum, "arith.minimumf": torch.minimum, "arith.maxnumf": torch.fmax,
    "arith.minnumf": torch.fmin,
}
UNARY_VECTOR = {"arith.negf": torch.neg, "math.absf": torch.abs, "math.floor": torch.floor, "math.ceil": torch.ceil}
UNARY_SPECIAL = {
    "math.exp": torch.exp, "math.exp2": torch.exp2, "math.log": torch.log, "math.log2": torch.log2,
    "math.sqrt": torch.sqrt, "math.rsqrt": torch.rsqrt, "math.tanh": torch.tanh, "math.erf": torch.erf,
    "math.sin": torch.sin, "math.cos": torch.cos,
}
BINARY_SPECIAL = {"math.powf": torch.pow}
COMBINERS = {"arith.addf": "sum", "arith.addi": "sum", "arith.maximumf": "amax", "arith.maxnumf": "amax",
             "arith.minimumf": "amin", "arith.minnumf": "amin", "arith.mulf": "prod"}
PREDICATES = {"eq": operator.eq, "ne": operator.ne, "slt": operator.lt, "sle": operator.le, "sgt": operator.gt,
              "sge": operator.ge, "ult": operator.lt, "ule": operator.le, "ugt": operator.gt, "uge": operator.ge,
              "oeq": torch.eq, "one": torch.ne, "olt": torch.lt, "ole": torch.le, "ogt": torch.gt, "oge": torch.ge,
              "ueq": torch.eq, "une": torch.ne, "ult_f": torch.lt}


def _result_type(op: Op) -> str:
    """The op's last type token (the result type in ``: T`` / ``-> T`` forms)."""
    types = [t.text for t in op.body if t.kind in ("ident", "type") and ("<" in t.text or t.text in _SCALARS)]
    if not types:
        raise KTIRUnsupported(op.name, op.line, "no result type found")
    return types[-1]


_SCALARS = {"f16", "bf16", "f32", "f64", "i1", "i8", "i16", "i32", "i64", "index"}


def _vector(core: Core, op: Op, t: torch.Tensor, deps: frozenset[int], special: bool = False,
            elements: int | None = None) -> TVal:
    """Record one SFU pass producing ``t`` (free when both sides are scalars: scalar math is not vector work)."""
    if t.dim() == 0 and elements is None:
        return TVal(t, deps)
    sb = core.stick_bytes
    row = t.shape[-1] if t.dim() else 1
    per = max(1, sb // t.element_size())
    out_bytes = math.prod(t.shape[:-1]) * -(-row // per) * sb if t.dim() else sb
    idx = core.run.add(Recorded("special" if special else "vector", f"{op.name.split('.')[-1]} L{op.line}",
                                tuple(sorted(deps)), f"{op.results[0] if op.results else 'v'}@{op.line}",
                                out_bytes, elements=elements or stick_elements(t, sb), line=op.line))
    return TVal(t, frozenset({idx}))


def stick_elements(t: torch.Tensor, stick_bytes: int) -> int:
    """Elements the SFU passes over: it works on whole sticks, so the innermost dim counts padded to a stick."""
    if t.dim() == 0:
        return 1
    per = max(1, stick_bytes // t.element_size())
    return max(1, math.prod(t.shape[:-1]) * -(-t.shape[-1] // per) * per)


def _tv(core: Core, name: str, op: Op) -> TVal:
    v = core.get(name, op)
    if isinstance(v, TVal):
        return v
    if isinstance(v, (int, float, bool)):
        return TVal(torch.tensor(v))
    raise KTIRUnsupported(op.name, op.line, f"{name} is not a tensor or scalar")


def constant(core: Core, op: Op) -> object:
    toks = op.body
    if not toks:
        raise KTIRUnsupported(op.name, op.line, "no value")
    typ = _result_type(op)
    shape, dtype = shaped(typ, op.line)
    first = toks[0].text
    if first.startswith("dense<"):
        inner = first[6:-1].strip()
        if inner.startswith("["):
            return TVal(_dense_list(inner, shape, dtype, op))
        value = _number(inner, dtype, op)
        return TVal(torch.full(shape, value, dtype=dtype))
    if first in ("true", "false"):
        return first == "true"
    value = _number(first, dtype, op)
    if typ in ("index", "i32", "i64", "i16", "i8") and isinstance(value, int):
        return value
    return TVal(torch.tensor(value, dtype=dtype))


def _dense_list(inner: str, shape: tuple[int, ...], dtype: torch.dtype, op: Op) -> torch.Tensor:
    """``dense<[0, 22, 32]>``: a 1-D list of values (a table the kernel indexes with ``tensor.extract``)."""
    if "[" in inner[1:]:
        raise KTIRUnsupported(op.name, op.line, "dense lists are modeled in one dimension only")
    items = [t.strip() for t in inner.strip("[]").split(",") if t.strip()]
    if len(shape) != 1 or len(items) != shape[0]:
        raise KTIRUnsupported(op.name, op.line, f"a dense list of {len(items)} values for the shape {list(shape)}")
    return torch.tensor([_number(t, dtype, op) for t in items], dtype=dtype)


def _number(text: str, dtype: torch.dtype, op: Op) -> float | int:
    try:
        if text.lower().startswith(("0x", "-0x")):
            bits = int(text, 16)
            if dtype == torch.float16:
                return struct.unpack("<e", struct.pack("<H", bits & 0xFFFF))[0]
            if dtype == torch.float32:
                return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]
            return bits
        return float(text) if any(c in text for c in ".eEn") or dtype.is_floating_point else int(text)
    except ValueError as e:
        raise KTIRUnsupported(op.name, op.line, f"cannot read the constant {text!r}") from e


def int_binary(core: Core, op: Op) -> object:
    a, b = (core.get(v, op) for v in op.values()[:2])
    if isinstance(a, Pointer) and isinstance(b, int) and op.name in ("arith.addi", "arith.subi"):
        return Pointer(a.buffer, a.offset + (b if op.name == "arith.addi" else -b))
    if isinstance(b, Pointer) and isinstance(a, int) and op.name == "arith.addi":
        return Pointer(b.buffer, b.offset + a)
    if not (isinstance(a, int) and isinstance(b, int)):
        raise KTIRUnsupported(op.name, op.line, "integer ops are modeled on index / integer scalars only")
    return INT_OPS[op.name](a, b)


def float_binary(core: Core, op: Op) -> TVal:
    a, b = (_tv(core, v, op) for v in op.values()[:2])
    out = FLOAT_OPS[op.name](a.t, b.t)
    dtype = a.t.dtype if a.t.dim() else b.t.dtype
    return _vector(core, op, out.to(dtype), a.deps | b.deps)


def special_binary(core: Core, op: Op) -> TVal:
    a, b = (_tv(core, v, op) for v in op.values()[:2])
    return _vector(core, op, BINARY_SPECIAL[op.name](a.t, b.t).to(a.t.dtype), a.deps | b.deps, special=True)


def unary(core: Core, op: Op) -> TVal:
    a = _tv(core, op.values()[0], op)
    special = op.name in UNARY_SPECIAL
    fn = UNARY_SPECIAL.get(op.name) or UNARY_VECTOR[op.name]
    return _vector(core, op, fn(a.t).to(a.t.dtype), a.deps, special=special)


def cast(core: Core, op: Op) -> object:
    v = core.get(op.values()[0], op)
    _, dtype = shaped(_result_type(op), op.line)
    if isinstance(v, TVal):
        return _vector(core, op, v.t.to(dtype), v.deps)
    return v if op.name == "arith.index_cast" else TVal(torch.tensor(v, dtype=dtype))


def cmp(core: Core, op: Op) -> object:
    pred = next(t.text for t in op.body if t.kind == "ident")
    a, b = (core.get(v, op) for v in op.values()[:2])
    if op.name == "arith.cmpi" and isinstance(a, int) and isinstance(b, int):
        return bool(PREDICATES[pred](a, b))
    fn = PREDICATES.get(pred if op.name == "arith.cmpf" else pred + "_f", PREDICATES.get(pred))
    if fn is None or not callable(fn):
        raise KTIRUnsupported(op.name, op.line, f"predicate {pred!r}")
    ta, tb = _tv(core, op.values()[0], op), _tv(core, op.values()[1], op)
    return _vector(core, op, torch.as_tensor(fn(ta.t, tb.t)), ta.deps | tb.deps)


def select(core: Core, op: Op) -> object:
    c, a, b = (core.get(v, op) for v in op.values()[:3])
    if isinstance(c, bool):
        return a if c else b
    tc, ta, tb = (_tv(core, v, op) for v in op.values()[:3])
    return _vector(core, op, torch.where(tc.t, ta.t, tb.t), tc.deps | ta.deps | tb.deps)


def tile_id(core: Core, op: Op) -> list[int]:
    n = len(op.results)
    ids = list(core.tile_id) + [0] * max(0, n - len(core.tile_id))
    return ids[:n]


def splat(core: Core, op: Op) -> TVal:
    s = _tv(core, op.values()[0], op)
    shape, dtype = shaped(_result_type(op), op.line)
    return TVal(torch.full(shape, float(s.t.reshape(()).item()), dtype=dtype), s.deps)


def extract(core: Core, op: Op) -> TVal:
    names = op.values()
    src = _tv(core, names[0], op)
    idx = tuple(core.get(n, op) for n in names[1:])
    if not all(isinstance(i, int) for i in idx):
        raise KTIRUnsupported(op.name, op.line, "the indices must be index values")
    value = src.t[idx] if idx else src.t.reshape(())
    if _result_type(op) == "index" or (value.dim() == 0 and src.t.dtype == torch.int64 and not src.deps):
        return int(value)        # an entry of an index table: scalar index math, free
    return TVal(value, src.deps)


def empty(core: Core, op: Op) -> TVal:
    shape, dtype = shaped(_result_type(op), op.line)
    return TVal(torch.zeros(shape, dtype=dtype))


def concat(core: Core, op: Op) -> TVal:
    """``tensor.concat dim(k) %a, %b : (A, B) -> C``: the pieces joined in LX, one SFU pass over the result."""
    toks = [t.text for t in op.body]
    if "dim" not in toks or toks.index("dim") + 2 >= len(toks):
        raise KTIRUnsupported(op.name, op.line, "needs dim(k)")
    dim = int(toks[toks.index("dim") + 2])
    parts = [_tv(core, v, op) for v in op.values()]
    try:
        t = torch.cat([p.t for p in parts], dim)
    except RuntimeError as e:
        raise KTIRUnsupported(op.name, op.line, f"the pieces do not join along dim {dim}: {e}") from e
    return _vector(core, op, t, frozenset().union(*(p.deps for p in parts)))


def reshape(core: Core, op: Op) -> TVal:
    src = _tv(core, op.values()[0], op)
    shape, _ = shaped(_result_type(op), op.line)
    return TVal(src.t.reshape(shape), src.deps)


def fill(core: Core, op: Op) -> TVal:
    value, init = (_tv(core, v, op) for v in op.values()[:2])
    return TVal(torch.full(init.t.shape, float(value.t.reshape(()).item()), dtype=init.t.dtype), value.deps)


def _combiner(op: Op) -> str:
    names = [o.name for r in op.regions for o in r.ops if o.name not in ("linalg.yield", "scf.yield")]
    if len(names) != 1 or names[0] not in COMBINERS:
        raise KTIRUnsupported(op.name, op.line, f"the combiner must be one of {sorted(COMBINERS)}, got {names}")
    return COMBINERS[names[0]]


def reduce(core: Core, op: Op) -> TVal:
    kind = _combiner(op)
    src, init = (_tv(core, v, op) for v in op.values()[:2])
    dims = _int_list(op, "dimensions")
    x = src.t.float()
    r = {"sum": lambda: x.sum(dims), "amax": lambda: x.amax(dims), "amin": lambda: x.amin(dims),
         "prod": lambda: x.prod(dims[0]) if len(dims) == 1 else x.flatten().prod()}[kind]()
    r = r.reshape(init.t.shape)
    both = {"sum": lambda: r + init.t.float(), "amax": lambda: torch.maximum(r, init.t.float()),
            "amin": lambda: torch.minimum(r, init.t.float()), "prod": lambda: r * init.t.float()}[kind]()
    return _vector(core, op, both.to(init.t.dtype), src.deps | init.deps,
                   elements=stick_elements(src.t, core.stick_bytes))


def _int_list(op: Op, key: str) -> list[int]:
    toks = [t.text for t in op.body]
    if key in op.attrs:
        vals = op.attrs[key]
    elif key in toks:
        i = toks.index(key)
        end = toks.index("]", i)
        vals = op.body[i + 2:end + 1]
    else:
        raise KTIRUnsupported(op.name, op.line, f"needs {key} = [...]")
    return [int(t.text) for t in vals if t.kind == "number"]


def matmul(core: Core, op: Op) -> TVal:
    a, b, c = (_tv(core, v, op) for v in op.values()[:3])
    if a.t.dim() != 2 or b.t.dim() != 2 or a.t.shape[1] != b.t.shape[0]:
        raise KTIRUnsupported(op.name, op.line, f"needs [m,k] x [k,n], got {list(a.t.shape)} x {list(b.t.shape)}")
    out = (c.t.float() + a.t.float() @ b.t.float()).to(c.t.dtype)
    m, k = a.t.shape
    n = b.t.shape[1]
    sb = core.stick_bytes
    out_bytes = m * -(-n * out.element_size() // sb) * sb
    idx = core.run.add(Recorded("matmul", f"matmul {m}x{n}x{k} L{op.line}", tuple(sorted(a.deps | b.deps | c.deps)),
                                f"{op.results[0]}@{op.line}", out_bytes, mnk=(m, n, k), line=op.line))
    return TVal(out, frozenset({idx}))


def named_binary(core: Core, op: Op) -> TVal:
    a, b = (_tv(core, v, op) for v in op.values()[:2])
    fn = {"linalg.add": torch.add, "linalg.sub": torch.sub, "linalg.mul": torch.mul, "linalg.div": torch.div,
          "linalg.max": torch.maximum}[op.name]
    return _vector(core, op, fn(a.t, b.t).to(a.t.dtype), a.deps | b.deps)


def memory_view(core: Core, op: Op) -> MemoryView:
    ptr = core.get(op.values()[0], op)
    if not isinstance(ptr, Pointer):
        raise KTIRUnsupported(op.name, op.line, "the base must be a pointer argument (plus index offsets)")
    sizes, strides = (_index_list(core, op, key) for key in ("sizes", "strides"))
    _, dtype = shaped(_result_type(op), op.line)
    space = "".join(t.text for t in op.attrs.get("memory_space", []))
    coords = op.attrs.get("coordinate_set")
    return MemoryView(ptr, tuple(sizes), tuple(strides), _set(core, coords, op) if coords else None, dtype,
                      on_chip=any(s in space for s in ("ct_local", "LX", "lx")))


def _index_list(core: Core, op: Op, key: str) -> list[int]:
    toks = op.body
    for i, t in enumerate(toks):
        if t.text == key and i + 2 < len(toks) and toks[i + 1].text == ":":
            out, j = [], i + 3
            while toks[j].text != "]":
                if toks[j].kind == "number":
                    out.append(int(toks[j].text))
                elif toks[j].kind == "value":
                    v = core.get(toks[j].text, op)
                    if not isinstance(v, int):
                        raise KTIRUnsupported(op.name, op.line, f"{key} entries must be index values")
                    out.append(v)
                j += 1
            return out
    raise KTIRUnsupported(op.name, op.line, f"needs {key}: [...]")


def _set(core: Core, toks: list, op: Op):
    text = toks[0].text
    text = core.aliases.get(text).text if text in core.aliases else text
    return parse_set(text, toks[0].line, toks[0].col)


def access_tile(core: Core, op: Op) -> AccessTile:
    names = op.values()
    view = core.get(names[0], op)
    if not isinstance(view, MemoryView):
        raise KTIRUnsupported(op.name, op.line, f"{names[0]} is not a memory view")
    base = tuple(core.get(n, op) for n in names[1:])
    if len(base) != len(view.sizes) or not all(isinstance(b, int) for b in base):
        raise KTIRUnsupported(op.name, op.line, f"needs {len(view.sizes)} index values, got {len(base)}")
    shape, _ = shaped(_result_type(op), op.line)
    ts = op.attrs.get("access_tile_set")
    order_toks = op.attrs.get("access_tile_order")
    order_map = None
    if order_toks:
        text = order_toks[0].text
        text = core.aliases[text].text if text in core.aliases else text
        order_map = parse_map(text, order_toks[0].line, order_toks[0].col)
    try:
        order = order_of(order_map, len(shape))
    except ValueError as e:
        raise KTIRUnsupported(op.name, op.line, "access_tile_order must permute the tile dims") from e
    return AccessTile(view, base, shape, _set(core, ts, op) if ts else None, order)


def do_load(core: Core, op: Op) -> TVal:
    tile = core.get(op.values()[0], op)
    if not isinstance(tile, AccessTile):
        raise KTIRUnsupported(op.name, op.line, "loads an access tile (ktdp.construct_access_tile)")
    declared, dtype = shaped(_result_type(op), op.line)
    if declared != tile.result_shape():
        raise KTIRUnsupported(op.name, op.line, f"declares {list(declared)} but the access tile is "
                                                f"{list(tile.result_shape())}")
    t, nbytes, key = load(tile, core.buffers, core.stick_bytes)
    t = t.to(dtype)
    if nbytes == 0:
        return TVal(t)
    idx = core.run.add(Recorded("load", f"load {tile.view.pointer.buffer} L{op.line}", core.slot_wait(),
                                f"{op.results[0]}@{op.line}", nbytes, nbytes=nbytes, key=key, line=op.line))
    return TVal(t, frozenset({idx}))


def do_store(core: Core, op: Op) -> None:
    names = op.values()
    value, tile = _tv(core, names[0], op), core.get(names[1], op)
    if not isinstance(tile, AccessTile):
        raise KTIRUnsupported(op.name, op.line, "stores into an access tile (ktdp.construct_access_tile)")
    nbytes = store(value.t, tile, core.buffers, core.stick_bytes)
    if nbytes:
        core.run.add(Recorded("store", f"store {tile.view.pointer.buffer} L{op.line}", tuple(sorted(value.deps)),
                              nbytes=nbytes, line=op.line))


def affine_apply(core: Core, op: Op) -> int:
    first = op.body[0]
    text = core.aliases[first.text].text if first.text in core.aliases else first.text
    amap = parse_map(text, first.line, first.col)
    args = [core.get(n, op) for n in op.values()]
    dims, syms = args[:len(amap.dims)], args[len(amap.dims):]
    out = amap.apply(dims, syms)
    if op.name == "affine.min":
        return min(out)
    if op.name == "affine.max":
        return max(out)
    return out[0]


def nothing(core: Core, op: Op) -> None:
    return None


HANDLERS = {
    "arith.constant": constant, "ktdp.get_compute_tile_id": tile_id,
    **{name: int_binary for name in INT_OPS}, **{name: float_binary for name in FLOAT_OPS},
    **{name: unary for name in (*UNARY_VECTOR, *UNARY_SPECIAL)},
    "math.powf": special_binary, "arith.extf": cast, "arith.truncf": cast, "arith.sitofp": cast,
    "arith.index_cast": cast,
    "arith.cmpi": cmp, "arith.cmpf": cmp, "arith.select": select,
    "tensor.splat": splat, "tensor.extract": extract, "tensor.empty": empty,
    "tensor.expand_shape": reshape, "tensor.collapse_shape": reshape, "linalg.fill": fill, "tensor.concat": concat,
    "linalg.reduce": reduce, "linalg.matmul": matmul,
    **{name: named_binary for name in ("linalg.add", "linalg.sub", "linalg.mul", "linalg.div", "linalg.max")},
    "ktdp.construct_memory_view": memory_view, "ktdp.construct_access_tile": access_tile,
    "ktdp.load": do_load, "ktdp.store": do_store,
    "affine.apply": affine_apply, "affine.min": affine_apply, "affine.max": affine_apply,
}


def broadcast(core: Core, op: Op) -> TVal:
    """``linalg.broadcast ins(%a) outs(%init) dimensions = [..]``: ``dimensions`` are the output's added dims.

    Free: the SFU reads a broadcast operand in place, so no tile op is recorded."""
    src, init = (_tv(core, v, op) for v in op.values()[:2])
    t = src.t
    for d in sorted(_int_list(op, "dimensions")):
        t = t.unsqueeze(d)
    return TVal(t.expand(init.t.shape).to(init.t.dtype).contiguous(), src.deps)


HANDLERS["linalg.broadcast"] = broadcast
