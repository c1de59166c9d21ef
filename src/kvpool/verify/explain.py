"""Name what a CrossHair counterexample breaks: the invariant, or the postcondition clause.

CrossHair reports a failed contract as "``<condition>`` yields false when calling
``op(args)`` (which returns ``value``)". The condition of every operation contract is one
conjunction, "every invariant after, and ``<op>_post``", so that message alone cannot say
*what* is wrong. :func:`explain` re-reads the call and the returned value (both printed as
Python), re-evaluates the condition concretely and names:

* each broken invariant with its witnesses (``queued_iff_unreferenced broken by (3,)``);
* the first false clause of the postcondition, as its source text
  (``after.free_queue == tuple(b for b in state.free_queue if b not in hits)``): every
  ``return a and b and c`` of the ``*_post`` function is split into its operands;
* for a precondition contract, the error the precondition returned and the §12 rows that
  apply.

It never changes a verdict: when the message cannot be read back, the report keeps
CrossHair's own text and the explanation is ``None``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

_CALLING = " when calling "
_RETURNS = " (which returns "


def _namespace() -> dict[str, Any]:
    import kvpool.errors as errors
    from kvpool.spec import records
    from kvpool.spec.ops import Outcome
    from kvpool.spec.state import PoolState

    names: dict[str, Any] = {"PoolState": PoolState, "Outcome": Outcome}
    names.update({n: getattr(records, n) for n in dir(records) if n.endswith("Record")})
    names.update({n: getattr(errors, n) for n in dir(errors) if not n.startswith("_")})
    return names


_KEYWORD_WALRUS = re.compile(r"(?<=[(,\s])(\w+)=(v\d+):=")


def _parenthesize_walruses(text: str) -> str:
    """``f(x=v1:=())`` (CrossHair's repr of a shared value) → ``f(x=(v1:=()))``: valid Python."""
    while (m := _KEYWORD_WALRUS.search(text)) is not None:
        i, depth, quote = m.end(), 0, ""
        while i < len(text):
            c = text[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote:
                    quote = ""
            elif c in "'\"":
                quote = c
            elif c in "([{":
                depth += 1
            elif c in ")]}":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
            i += 1
        text = f"{text[:m.start()]}{m[1]}=({m[2]}:={text[m.end():i]}){text[i:]}"
    return text


def parse_call(message: str) -> tuple[str, tuple, Any] | None:
    """``(function name, positional args, returned value)`` from a CrossHair message."""
    start = message.find(_CALLING)
    end = message.rfind(_RETURNS)
    if start < 0 or not message.endswith(")"):
        return None
    if end < start:  # CrossHair leaves out "(which returns None)"
        call_text, value_text = message[start + len(_CALLING):], "None"
    else:
        call_text = message[start + len(_CALLING):end]
        value_text = message[end + len(_RETURNS):-1]
    call_text, value_text = _parenthesize_walruses(call_text), _parenthesize_walruses(value_text)
    try:
        call = ast.parse(call_text, mode="eval").body
        if not isinstance(call, ast.Call) or call.keywords:
            return None
        names = _namespace()
        args = tuple(eval(compile(ast.Expression(a), "<arg>", "eval"), names) for a in call.args)
        value = eval(value_text, names)
    except Exception:  # noqa: BLE001 - an unreadable message keeps CrossHair's text
        return None
    name = call.func.id if isinstance(call.func, ast.Name) else ast.unparse(call.func)
    return name, args, value


class _SplitReturns(ast.NodeTransformer):
    """``return a and b`` → ``if not (a): return "a"`` …; other returns → ``"whole"`` if false."""

    def __init__(self, source: str) -> None:
        self.source = source

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.decorator_list = []
        self.generic_visit(node)
        return node

    def visit_Return(self, node: ast.Return) -> Any:
        value = node.value
        if value is None:  # a bare return: nothing to check
            return node
        parts = value.values if isinstance(value, ast.BoolOp) and isinstance(
            value.op, ast.And) else [value]
        checks: list[ast.stmt] = []
        for part in parts:
            text = " ".join((ast.get_source_segment(self.source, part) or ast.unparse(part))
                            .split())
            checks.append(ast.If(
                test=ast.UnaryOp(op=ast.Not(), operand=part),
                body=[ast.Return(value=ast.Constant(text))], orelse=[]))
        checks.append(ast.Return(value=ast.Constant(None)))
        return checks


def first_false_clause(condition: Callable[..., bool], **kwargs: Any) -> str | None:
    """The source text of the first false operand of ``condition``'s returned conjunction."""
    try:
        source = textwrap.dedent(inspect.getsource(condition))
        tree = ast.parse(source)
        tree = ast.fix_missing_locations(_SplitReturns(source).visit(tree))
        scope: dict[str, Any] = dict(condition.__globals__)
        exec(compile(tree, f"<clauses of {condition.__name__}>", "exec"), scope)
        return scope[condition.__name__](**kwargs)
    except Exception:  # noqa: BLE001 - explanation only
        return None


def explain(target: str, message: str, pythonpath: Sequence[str | os.PathLike] = ()
            ) -> str | None:
    """What the counterexample in ``message`` (for contract ``target``, a ``module.function``
    importable with ``pythonpath``) breaks, in words."""
    parsed = parse_call(message)
    if parsed is None:
        return None
    _, args, value = parsed
    fn = _target_function(target, pythonpath)
    if getattr(fn, "kvpool_call_tuple", False) and len(args) == 2:
        args = (args[0], *args[1])  # a focused contract's (state, call): the op's arguments
    if "rejects_exactly_the_invalid_rows" in message:
        op = getattr(fn, "kvpool_precondition_of", None)
        return None if op is None else _explain_precondition(op, args, value)
    return _explain_operation(message, args, value)


def _target_function(target: str, pythonpath: Sequence[str | os.PathLike]) -> Any:
    module_name, _, name = target.rpartition(".")
    saved = list(sys.path)
    sys.path[:0] = [str(p) for p in pythonpath]
    try:
        return getattr(importlib.import_module(module_name), name)
    except Exception:  # noqa: BLE001 - explanation only
        return None
    finally:
        sys.path[:] = saved


def _rows() -> dict:
    from kvpool.spec.precondition_contracts import INVALID_ROWS

    return INVALID_ROWS


def _explain_precondition(op: str, args: tuple, value: Any) -> str:
    rows_of, _ = _rows()[op]
    rows = rows_of(*args)
    said = "accepts the call" if value is None else f"returns {type(value).__name__}"
    want = ("§12 says the call is valid" if not rows
            else "§12 rows: " + " or ".join(r.__name__ for r in rows))
    return f"{op} precondition {said}; {want}"


def _explain_operation(message: str, args: tuple, value: Any) -> str | None:
    from kvpool.spec.contracts import CONTRACTS
    from kvpool.spec.invariants import violated_invariants

    post_name = next((f"{name}_post" for name in CONTRACTS if f"{name}_post" in message), None)
    if post_name is None:
        return None
    name = post_name.removesuffix("_post")
    _, post = CONTRACTS[name]
    lines = []
    state = getattr(value, "state", None)
    if state is not None:
        for invariant, witnesses in violated_invariants(state):
            lines.append(f"invariant {invariant} broken by {witnesses!r}")
    params = list(inspect.signature(post).parameters)[:-1]  # the last one is result
    if len(params) == len(args):
        clause = first_false_clause(post, **dict(zip(params, args, strict=True)), result=value)
        if clause:
            lines.append(f"{post_name} clause false: {clause}")
    return "; ".join(lines) or None


__all__ = ["explain", "first_false_clause", "parse_call"]
