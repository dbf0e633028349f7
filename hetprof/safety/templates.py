"""Jinja templates someone else wrote (a model's chat template): sandboxed, with time and output caps.

A chat template is code from a model folder. Jinja's ImmutableSandboxedEnvironment stops it reaching
Python internals, but not from looping for minutes or doubling a string until memory runs out. So
`BoundedTemplate` renders in such a sandbox where every call, attribute, operator, `range` step,
string join, filter and output chunk checks a deadline and an output-size cap, and refuses with
`TemplateLimit` past either; the template's own errors pass through unchanged.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

MAX_SECONDS = 2.0  # a real chat template renders in microseconds
MAX_CHARS = 4 << 20  # a rendered prompt of 4M characters is ~1M tokens, beyond any context
MAX_INT_BITS = 1 << 16  # no template counts past 2**65536
TEMPLATE_FILE = "<template>"  # the file name jinja compiles a from_string template under


class TemplateLimit(Exception):
    """A template ran past its time or output cap; the message names which."""


class BoundedTemplate:
    """One template compiled once, rendered many times each within `seconds` and `chars`."""

    def __init__(self, source: str, seconds: float | None = None, chars: int | None = None):
        self.seconds = MAX_SECONDS if seconds is None else seconds
        self.chars = MAX_CHARS if chars is None else chars
        self._env = _environment(self)
        self._deadline = 0.0
        self._template = self._env.from_string(source)
        namespace = self._template.root_render_func.__globals__  # this template's own, not jinja's
        for name in ("str_join", "markup_join"):
            if name in namespace:
                namespace[name] = self._joiner(namespace[name])

    def render(self, **variables: Any) -> str:
        self._deadline = time.monotonic() + self.seconds
        out, size = [], 0
        previous = sys.gettrace()
        sys.settrace(self._trace)  # a bare loop calls nothing: its lines are where the deadline is checked
        try:
            for chunk in self._template.generate(**variables):
                size += len(chunk)
                self.check(size)
                out.append(chunk)
        except RecursionError:
            raise TemplateLimit("its macros or includes nest too deep") from None
        finally:
            sys.settrace(previous)
        return "".join(out)

    def _trace(self, frame: Any, event: str, _arg: Any) -> Any:
        if frame.f_code.co_filename != TEMPLATE_FILE:
            return None  # jinja's and Python's own frames are not traced line by line
        self.check()
        return self._line

    def _line(self, _frame: Any, event: str, _arg: Any) -> Any:
        if event == "line":
            self.check()
        return self._line

    def check(self, size: int = 0) -> None:
        if size > self.chars:
            raise TemplateLimit(f"its output passed {self.chars:,} characters")
        if time.monotonic() > self._deadline:
            raise TemplateLimit(f"it ran past {self.seconds:g} s")

    def sized(self, value: Any) -> Any:
        if isinstance(value, (str, bytes, list, tuple, dict)):
            self.check(len(value))
        elif type(value) is int and value.bit_length() > MAX_INT_BITS:
            raise TemplateLimit(f"it made a number of more than {MAX_INT_BITS:,} bits")
        else:
            self.check()
        return value

    def _joiner(self, join: Any) -> Any:
        def bounded(seq: Any) -> Any:
            parts = list(seq)
            self.check(sum(len(p) for p in parts if isinstance(p, str)))
            return join(parts)
        return bounded

    def _range(self, *args: int) -> Iterator[int]:
        for i in range(*args):
            self.check()
            yield i


def _environment(owner: BoundedTemplate) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): its body as is."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(("+", "-", "*", "/", "//", "%", "**"))
        intercepted_unops = frozenset(("+", "-"))

        def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            for value in (*args, *kwargs.values()):
                if type(value) is int and abs(value) > owner.chars:  # `"x"|center(10**9)` allocates first
                    raise TemplateLimit(f"it passed {value:,} to a call, more than {owner.chars:,}")
            owner.check()
            return owner.sized(super().call(__context, __obj, *args, **kwargs))

        def getattr(self, obj: Any, attribute: str) -> Any:
            owner.check()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            owner.check()
            return super().getitem(obj, argument)

        def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
            if operator_ in ("*", "**") and isinstance(left, (str, list, int)) and isinstance(right, int):
                if isinstance(left, (str, list)) and len(left) * right > owner.chars:
                    raise TemplateLimit(f"its output passed {owner.chars:,} characters")
                if operator_ == "**" and isinstance(left, int) and left.bit_length() * abs(right) > MAX_INT_BITS:
                    raise TemplateLimit(f"it made a number of more than {MAX_INT_BITS:,} bits")
            owner.check()
            return owner.sized(super().call_binop(context, operator_, left, right))

        def call_unop(self, context: Any, operator_: str, arg: Any) -> Any:
            owner.check()
            return super().call_unop(context, operator_, arg)

    env = Bounded(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters = {name: _bounded_filter(owner, f) for name, f in env.filters.items()}
    env.filters["tojson"] = _bounded_filter(owner, _tojson)
    env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       range=owner._range)
    return env


def _bounded_filter(owner: BoundedTemplate, f: Any) -> Any:
    import functools

    @functools.wraps(f)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        for value in (*args, *kwargs.values()):
            if type(value) is int and abs(value) > owner.chars:
                raise TemplateLimit(f"it passed {value:,} to a filter, more than {owner.chars:,}")
        owner.check()
        return owner.sized(f(*args, **kwargs))
    return bounded


def _tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


