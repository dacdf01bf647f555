"""Each implementation of a stoker Protocol has its methods, taking the arguments its callers pass.

Checked on the type, without calling anything: every method the Protocol declares (its own and
those of the Protocols it extends) exists on the implementation as a method, with the same
parameters (self aside): as many, in the same order, of the same kinds, with the same defaults,
and the same names wherever a caller may pass them by name (a positional-only parameter of the
Protocol may be named as the implementation likes). Return types are not compared.

Python classes are read with ``inspect.signature``; a nanobind class (``_stoker``) from the
``__nb_signature__`` nanobind attaches to each of its methods, the signature of the compiled
binding itself (the ``.pyi`` stub is generated from it, and could be out of date).

To check another implementation, add one line to ``IMPLEMENTATIONS``: ``"module:Class"`` and its
Protocol.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from typing import Protocol

import pytest

from stoker.loader.gpu.runtime import CudaEvent, CudaRuntime
from stoker.worker.endpoint import ChannelEndpoint, Endpoint

pytestmark = pytest.mark.unit  # no process (tests/support/tiers.py)

IMPLEMENTATIONS = [
    ("stoker._stoker:WorkerEndpoint", ChannelEndpoint),  # the local placement's (C++)
    ("stoker.placements.ray.actor:ActorEndpoint", Endpoint),  # a Ray actor's (Python)
    ("stoker.loader.gpu.cuda:TorchCuda", CudaRuntime),
    ("fake_cuda:FakeCuda", CudaRuntime),  # the CPU tests' GPU
    ("torch.cuda:Event", CudaEvent),  # what TorchCuda.record returns
    ("stoker.loader.gpu.cuda:_Barrier", CudaEvent),  # what TorchCuda.barrier returns
    ("fake_cuda:FakeEvent", CudaEvent),
    ("fake_cuda:FakeBarrier", CudaEvent),
]

_P = inspect.Parameter


def protocol_methods(protocol) -> dict[str, inspect.Signature]:
    """The public methods `protocol` declares, with those of the Protocols it extends."""
    out = {}
    for cls in reversed(protocol.__mro__):
        if not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue
        for name, value in vars(cls).items():
            if not name.startswith("_") and inspect.isfunction(value):
                out[name] = _without_self(inspect.signature(value))
    assert out, f"{protocol.__qualname__} declares no method"
    return out


def _without_self(sig: inspect.Signature) -> inspect.Signature:
    params = list(sig.parameters.values())
    return sig.replace(parameters=params[1:])


def _nanobind_signatures(func) -> list[inspect.Signature]:
    """One signature per overload, from nanobind's ``(text, doc, defaults)`` entries: the text
    is a ``def`` line whose default values are ``\\N``, the N-th of `defaults`."""
    out = []
    for text, _doc, defaults in func.__nb_signature__:
        source = re.sub(r"\\(\d+)", r"__nb_default_\1", text) + ": ..."
        try:
            node = ast.parse(source).body[0]
        except SyntaxError as e:
            raise AssertionError(f"cannot read nanobind's signature {text!r}: {e}") from None
        static = any(isinstance(d, ast.Name) and d.id == "staticmethod"
                     for d in node.decorator_list)
        out.append(_from_ast(node.args, defaults or (), skip_first=not static))
    return out


def _from_ast(args: ast.arguments, defaults, skip_first: bool) -> inspect.Signature:
    def value(expr):
        m = re.fullmatch(r"__nb_default_(\d+)", ast.unparse(expr))
        return defaults[int(m.group(1))] if m else ast.literal_eval(expr)

    params = []
    positional = [(a, _P.POSITIONAL_ONLY) for a in args.posonlyargs] + [
        (a, _P.POSITIONAL_OR_KEYWORD) for a in args.args]
    first_default = len(positional) - len(args.defaults)
    for i, (a, kind) in enumerate(positional):
        default = value(args.defaults[i - first_default]) if i >= first_default else _P.empty
        params.append(_P(a.arg, kind, default=default))
    if args.vararg:
        params.append(_P(args.vararg.arg, _P.VAR_POSITIONAL))
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        params.append(_P(a.arg, _P.KEYWORD_ONLY, default=_P.empty if d is None else value(d)))
    if args.kwarg:
        params.append(_P(args.kwarg.arg, _P.VAR_KEYWORD))
    return inspect.Signature(params[1:] if skip_first else params)


def implementation_signatures(cls, name: str) -> list[inspect.Signature] | str:
    """The signatures of method `name` of `cls` (several for a nanobind overload), or why
    there is none."""
    try:
        attr = inspect.getattr_static(cls, name)
    except AttributeError:
        return "is missing"
    if hasattr(attr, "__nb_signature__"):
        return _nanobind_signatures(attr)
    if isinstance(attr, staticmethod):
        return [inspect.signature(attr.__func__)]
    if isinstance(attr, classmethod):
        return [_without_self(inspect.signature(attr.__func__))]
    if inspect.isfunction(attr):
        return [_without_self(inspect.signature(attr))]
    return f"is not a method ({type(attr).__name__})"


def differences(wanted: inspect.Signature, got: inspect.Signature) -> list[str]:
    """What stops a caller of `wanted` from calling `got` the same way (empty: nothing)."""
    w, g = list(wanted.parameters.values()), list(got.parameters.values())
    if len(w) != len(g):
        return [f"takes {len(g)} parameter(s) {got}, the protocol {len(w)} {wanted}"]
    out = []
    for p, q in zip(w, g):
        where = f"parameter {p.name!r}"
        if p.kind == _P.POSITIONAL_ONLY:
            if q.kind not in (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD):
                out.append(f"{where} is {q.kind.description} there, not positional")
        elif q.kind != p.kind or q.name != p.name:
            out.append(f"{where} ({p.kind.description}) is {q.name!r} "
                       f"({q.kind.description}) there")
        if (p.default is _P.empty) != (q.default is _P.empty):
            out.append(f"{where} has a default in only one of them: {p} / {q}")
        elif p.default is not _P.empty and (type(p.default) is not type(q.default)
                                            or p.default != q.default):
            out.append(f"{where} defaults to {q.default!r} there, to {p.default!r} in the "
                       "protocol")
    return out


def conformance_problems(cls, protocol) -> list[str]:
    """Every way `cls` falls short of `protocol`'s methods (empty: none)."""
    problems = []
    for name, wanted in protocol_methods(protocol).items():
        found = implementation_signatures(cls, name)
        if isinstance(found, str):
            problems.append(f"{name}() {found}")
            continue
        tried = [differences(wanted, sig) for sig in found]
        if all(tried):  # no overload fits
            problems += [f"{name}(): {d}" for d in min(tried, key=len)]
    return problems


def assert_implements(cls, protocol) -> None:
    problems = conformance_problems(cls, protocol)
    assert not problems, (f"{cls.__module__}.{cls.__qualname__} does not implement "
                          f"{protocol.__qualname__}:\n  " + "\n  ".join(problems))


def _load(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path,protocol", IMPLEMENTATIONS,
                         ids=[f"{p}-{proto.__name__}" for p, proto in IMPLEMENTATIONS])
def test_implementation_has_the_protocols_methods(path, protocol):
    assert_implements(_load(path), protocol)


# -- the check itself: it must fail when an implementation differs --------------------------------
class _Good:
    def send(self, kind, task, a=0, payload=b""):
        pass

    def send_batch(self, task, obj, mode, indices=None) -> bool:
        return True

    def enter(self, state, task, index, position=-1):
        pass

    def add_sample(self):
        pass

    def set_in_flight(self, n):
        pass

    def mark_ready(self, cpu_s, runqueue_s):
        pass

    def update_rss(self):
        pass

    def set_shared_memory_limit(self, cap_bytes, patience_s):
        pass


def _variant(**methods):
    """_Good with `methods` replaced (None: removed)."""
    body = {k: v for k, v in vars(_Good).items() if not k.startswith("__")}
    body.update(methods)
    return type("Variant", (), {k: v for k, v in body.items() if v is not None})


@pytest.mark.parametrize("methods,says", [
    ({"update_rss": None}, "update_rss() is missing"),
    ({"add_sample": lambda self, n: None}, "add_sample(): takes 1 parameter(s)"),
    ({"send": lambda self, kind, task, a=1, payload=b"": None}, "defaults to 1 there, to 0"),
    ({"send": lambda self, kind, task, a=0, payload="": None}, "defaults to '' there"),
    ({"enter": lambda self, state, task, index, position: None}, "a default in only one"),
    ({"send_batch": lambda self, task, obj, *, mode, indices=None: True}, "keyword-only"),
    ({"update_rss": property(lambda self: 0)}, "update_rss() is not a method (property)"),
])
def test_the_check_names_what_differs(methods, says):
    assert conformance_problems(_Good, Endpoint) == []  # names free: positional-only
    problems = conformance_problems(_variant(**methods), Endpoint)
    assert any(says in p for p in problems), problems


def test_the_check_compares_names_a_caller_may_pass():
    class Runtime:  # CudaRuntime's parameters are not positional-only: names count
        def register(self, addr, size):
            pass

    problems = conformance_problems(Runtime, CudaRuntime)
    assert "register(): parameter 'address' (positional or keyword) is 'addr' " \
           "(positional or keyword) there" in problems
    assert "barrier() is missing" in problems


def test_nanobind_signatures_are_read_with_their_defaults():
    from stoker import _stoker

    (sig,) = implementation_signatures(_stoker.WorkerEndpoint, "send")
    assert [(p.name, p.default) for p in sig.parameters.values()] == [
        ("type", _P.empty), ("task", _P.empty), ("a", 0), ("payload", b"")]

    class Differs(Protocol):
        def send(self, type: int, task: int, a: int = 1, payload: bytes = b"", /) -> None: ...

        def enter(self, state: int, task: int, index: object, /) -> None: ...

        def flush(self) -> None: ...

    problems = conformance_problems(_stoker.WorkerEndpoint, Differs)
    assert [p.split(" (")[0] for p in problems] == [
        "send(): parameter 'a' defaults to 0 there, to 1 in the protocol",
        "enter(): takes 4 parameter(s)",
        "flush() is missing"]
