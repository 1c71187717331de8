"""A griffe extension for the API pages (mkdocs.yml loads it): a class body that binds a function
of another module (``save_checkpoint = runs.save_checkpoint``, as the Trainer does) shows it as a
method of the class, with its docstring, and a ``property(..., doc=...)`` (or ``part_property``)
bound that way as a property with that text. Read statically, griffe would see attributes without docstrings."""

from __future__ import annotations

import ast
from typing import Any

import griffe


class BoundMethods(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for module in _modules(pkg):
            for cls in [
                member for member in module.members.values() if not member.is_alias and member.is_class
            ]:
                for name, member in list(cls.members.items()):
                    if member.is_alias or not member.is_attribute:
                        continue
                    bound = _bound(module, str(member.value or ""))
                    if bound is not None and bound.is_function:
                        cls.set_member(name, griffe.Alias(name, bound, lineno=member.lineno))
                    elif bound is not None:
                        cls.set_member(name, _property(name, member.lineno, bound))


def _modules(module: griffe.Module) -> list[griffe.Module]:
    inner = [member for member in module.members.values() if not member.is_alias and member.is_module]
    return [module, *(found for child in inner for found in _modules(child))]


def _bound(module: griffe.Module, value: str) -> Any:
    """The function or ``property(...)`` of another module that ``value`` (``runs.name``) names."""
    if "." not in value or "(" in value:
        return None
    try:
        target = module[value]
        target = target.final_target if target.is_alias else target
    except (KeyError, ValueError, griffe.AliasResolutionError):
        return None
    if target.is_function or str(target.value or "").startswith(("property(", "part_property(")):
        return target
    return None


def _property(name: str, lineno: int | None, bound: griffe.Attribute) -> griffe.Attribute:
    call = ast.parse(str(bound.value), mode="eval").body
    assert isinstance(call, ast.Call)
    doc = next((ast.literal_eval(keyword.value) for keyword in call.keywords if keyword.arg == "doc"), None)
    attribute = griffe.Attribute(name, lineno=lineno)
    attribute.labels |= {"property", "writable"} if len(call.args) > 1 else {"property"}
    if doc:
        attribute.docstring = griffe.Docstring(doc, parent=attribute)
    return attribute
