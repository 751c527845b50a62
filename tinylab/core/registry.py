"""Registries: one place where each kind of extension is listed, so that adding one (an attention
backend, a data transform, a growth operator, a T0 source) is one new entry, and every reader
(the config keys' choices, the tools, the docs) sees it without an edit.

    ATTENTION = Registry("attention backend")

    @ATTENTION.register("sdpa")
    class SDPA: ...

    ATTENTION.get("sdpa")      # the entry; an unknown name is a one-line UserError with a suggestion
    ATTENTION.names()          # in registration order, e.g. for a Key's choices

An entry is whatever the kind needs (a class, a dataclass instance, a function); the registry only
names them. Entries are registered when their module is imported: each registry's package imports
its entry modules in its __init__.py, so importing the package fills it.
"""
import difflib

from tinylab.core.errors import UserError


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._entries = {}

    def register(self, name: str, entry=None):
        """Register `entry` under `name`; without `entry`, a decorator."""
        if entry is None:
            return lambda obj: self.register(name, obj)
        if name in self._entries:
            raise ValueError(f"{self.kind} '{name}' is registered twice")
        self._entries[name] = entry
        return entry

    def get(self, name: str, source: str = ""):
        if name not in self._entries:
            match = difflib.get_close_matches(str(name), list(self._entries), n=1, cutoff=0.5)
            hint = f" (did you mean '{match[0]}'?)" if match else ""
            where = f"{source}: " if source else ""
            raise UserError(f"{where}unknown {self.kind} '{name}' (known: {', '.join(self._entries)}){hint}")
        return self._entries[name]

    def names(self) -> tuple:
        return tuple(self._entries)

    def items(self):
        return list(self._entries.items())

    def __contains__(self, name) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)
