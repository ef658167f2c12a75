"""Files from fetched values: transforms, templates, versions and the driver's path rules,
all within --max-response-bytes (provider/mount/mounting.py memoizes the result).

Two budgets: while building, paths and contents count against --max-response-bytes (so no class
makes the provider hold much more than the limit); the finished answer is then measured as the
driver will receive it, the serialized MountResponse (`provider.core.files.wire_size`), since
the driver's gRPC receive limit counts the framing of every file and object version too.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Collection, Hashable, Mapping, Sequence
from typing import Any, NamedTuple

from provider.core.boundedyaml import yaml_node_budget
from provider.core.errors import (
    BridgeError,
    InvalidParameters,
    LimitExceeded,
    MountFailed,
    NotFound,
)
from provider.core.files import (
    DRIVER_RECV_BYTES,
    File,
    ObjectVersion,
    overlap_problems,
    path_problem,
    shown_path,
    wire_size,
)
from provider.core.model import ObjectSpec, SecretValue
from provider.core.versions import Versioner
from provider.mount import templates, transforms
from provider.mount.planning import Inputs, MountPlan, failed_as, selects


class Built(NamedTuple):
    files: tuple[File, ...]
    versions: tuple[ObjectVersion, ...]
    #: Each object's name and the versions of the files it yielded (`file: false` ones too).
    object_versions: tuple[tuple[str, tuple[str, ...]], ...]


class Builder:
    def __init__(self, versioner: Versioner, max_bytes: int, max_objects: int = 100) -> None:
        self._versioner = versioner
        self._max_bytes = max_bytes
        #: --max-objects: the listed objects and the secrets selectors matched, together.
        self._max_objects = max_objects

    def failures(
        self, inputs: Inputs, values: Mapping[Hashable, Sequence[SecretValue]]
    ) -> list[tuple[str, BridgeError]]:
        """Each object's transform problem, for a mount that failed anyway: the objects that
        were fetched are built too, so a wrong secretKey shows beside an unreachable path."""
        failures: list[tuple[str, BridgeError]] = []
        parsed: dict[Any, Any] = {}
        with yaml_node_budget():
            for spec, key in inputs:
                if key in values:
                    try:
                        self._object_files(spec, values[key], self._max_bytes, "", parsed)
                    except BridgeError as exc:
                        failures.append((failed_as(spec), exc))
        return failures

    def build(
        self,
        plan: MountPlan,
        inputs: Inputs,
        values: Mapping[Hashable, Sequence[SecretValue]],
        permission: int,
        scope: str,
        absent: Collection[str] = (),
    ) -> Built:
        """All files, each step refused before it would build past what is left of
        --max-response-bytes. Every byte built counts, `file: false` inputs of templates too,
        so no class makes the provider hold more than about the limit for one mount.
        `absent`: the optional objects the store did not have (no files; a template that
        reads one fails)."""
        left = self._max_bytes
        files: list[File] = []
        #: What wrote each file (its object's or template's field), for collision messages.
        origins: list[str] = []
        versions: list[ObjectVersion] = []
        contents: dict[str, bytes] = {}
        input_versions: dict[str, str] = {}
        input_modes: dict[str, int] = {}
        failures: list[tuple[str, BridgeError]] = []
        parsed: dict[Any, Any] = {}
        per_object: list[tuple[str, tuple[str, ...]]] = []
        self._count_secrets(inputs, values)
        for spec, key in inputs:
            try:
                built = self._object_files(spec, values[key], left, scope, parsed)
            except BridgeError as exc:
                failures.append((failed_as(spec), exc))
                continue
            per_object.append((spec.name, tuple(b[3] for b in built)))
            for path, content, version_id, version in built:
                left -= len(content) + len(path)
                contents[path] = content
                input_versions[path] = version
                # Every file an object yields (extracted, exploded) gets the object's mode.
                mode = input_modes[path] = permission if spec.mode is None else spec.mode
                if spec.transforms.file:
                    files.append(File(path, mode, content))
                    origins.append(spec.field or spec.name)
                    versions.append(ObjectVersion(version_id, version))
        if failures:
            raise MountFailed(failures, context=plan.backend)
        for tmpl in plan.templates:
            missing = [name for name in tmpl.objects if name in absent]
            if missing:
                noun = "object" if len(missing) == 1 else "objects"
                raise NotFound(
                    f"{tmpl.field} ({tmpl.path!r}) reads the optional {noun} "
                    f"{', '.join(map(repr, missing))}, which the store does not have; create "
                    "it, or leave it out of the template"
                )
            content = templates.render(tmpl, contents, left - len(tmpl.path))
            left -= len(content) + len(tmpl.path)
            used = sorted(tmpl.objects or contents)
            version = self._versioner.of_inputs(
                tmpl.path, [input_versions.get(n, "") for n in used], content, scope=scope
            )
            mode = tmpl.mode if tmpl.mode is not None else _strictest(used, input_modes, permission)
            files.append(File(tmpl.path, mode, content))
            origins.append(tmpl.field)
            versions.append(ObjectVersion(tmpl.path, version))
        self._check(files, origins, versions, len(per_object), len(plan.templates))
        return Built(tuple(files), tuple(versions), tuple(per_object))

    def _count_secrets(
        self, inputs: Inputs, values: Mapping[Hashable, Sequence[SecretValue]]
    ) -> None:
        """Each selector stops at --max-objects; several, with the listed objects, may not
        pass it together either."""
        selected = [(spec, len(values[key])) for spec, key in inputs if selects(spec)]
        if not selected:
            return
        total = len(inputs) - len(selected) + sum(n for _, n in selected)
        if total > self._max_objects:
            counts = ", ".join(f"{spec.field} {n}" for spec, n in selected)
            raise LimitExceeded(
                f"the class's objects and the secrets its selectors match ({counts}) are "
                f"{total}, over this provider's limit of {self._max_objects} files per class "
                "(--max-objects); narrow a selector or split the class"
            )

    def _object_files(
        self,
        spec: ObjectSpec[Any],
        values: Sequence[SecretValue],
        limit: int,
        scope: str,
        parsed: dict[Any, Any],
    ) -> list[tuple[str, bytes, str, str]]:
        """(path, content, version id, version) for each file of one object, at most `limit`
        bytes of paths and contents in all."""
        out = []
        for value in values:
            base = "/".join(p for p in (spec.name, value.suffix) if p)
            # The object's own path counts too; sub-paths of explode are checked at the end.
            pieces = transforms.apply(
                spec, value, limit - len(base), work=self._max_bytes, parsed=parsed
            )
            for sub, content in pieces:
                path = f"{base}/{sub}" if sub else base
                limit -= len(content) + len(path)
                problem = path_problem(path)
                if problem:
                    raise InvalidParameters(_path_refused(spec, value, problem))
                # Ids as the store's upstream provider reports them (docs/compatibility.md);
                # a file of `explode` is named by its path.
                version_id = (value.version_id or spec.version_id or path) if not sub else path
                if value.version and spec.transforms.identity:
                    version = value.version
                else:
                    version = self._versioner.of_content(version_id, content, scope=scope)
                out.append((path, content, version_id, version))
        return out

    def _check(
        self,
        files: list[File],
        origins: list[str],
        versions: list[ObjectVersion],
        objects: int,
        templates: int,
    ) -> None:
        problems = overlap_problems([f.path for f in files], origins)
        if problems:
            raise InvalidParameters(problems)
        if not files:
            raise InvalidParameters("the mount produced no files; the driver would keep old files")
        # The answer as it goes on the wire: the driver's gRPC receive limit counts the
        # serialized MountResponse, framing of every file and object version included.
        total = wire_size(files, versions)
        if total > self._max_bytes:
            contents = sum(len(f.contents) for f in files)
            made = _count(objects, "object")
            if templates:
                made += f" and {_count(templates, 'template')}"
            raise LimitExceeded(
                f"the answer would be {total} bytes as sent to the driver ({made}, "
                f"{_count(len(files), 'file')}: {contents} bytes of contents, "
                f"{total - contents} of paths, modes, versions and framing), over the "
                f"provider's limit of {self._max_bytes} "
                "(--max-response-bytes); split the class, or raise --max-response-bytes together "
                "with the driver's --max-call-recv-msg-size (default "
                f"{DRIVER_RECV_BYTES}), which refuses larger answers "
                "(over 1 MiB also breaks sync to a Kubernetes Secret)"
            )


def _path_refused(spec: ObjectSpec[Any], value: SecretValue, problem: str) -> str:
    """A file path the driver would refuse, named with what made it and how to fix it."""
    if selects(spec):
        return (
            f"{spec.field}: the selected secret {shown_path(value.suffix)}: {problem}; rename the "
            "secret, or narrow the selector so it does not match it"
        )
    return f"{spec.field or 'object'}: {problem}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _strictest(names: Sequence[str], modes: Mapping[str, int], default: int) -> int:
    """A template's default mode: no more readable than any object it renders (the bitwise AND
    of their modes), so a secret never becomes more readable by being templated."""
    if not names:
        return default
    return functools.reduce(operator.and_, (modes.get(n, default) for n in names))
