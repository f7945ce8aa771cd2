"""Validation of Jobs, Pods and Secrets with the real API server's field paths and messages (422 Invalid).

It covers what the fake's behaviour depends on or a client is likely to get wrong: names, labels, containers,
env, volumes, restart policies, Job counts and podFailurePolicy, and the fields an update may not change.
"""

from __future__ import annotations

import re
from typing import Any

from agl_fake_k8s.meta import JsonObj
from agl_fake_k8s.status import FieldError

__all__ = [
    "validate_job",
    "validate_job_update",
    "validate_pod",
    "validate_pod_update",
    "validate_secret",
    "validate_secret_update",
]

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for "
    "validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_NAME_PART_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
    "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*\Z")
_ENV_NAME_MSG = (
    "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must "
    "not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation "
    "is '[-._a-zA-Z][-._a-zA-Z0-9]*')"
)
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+\Z")
_CONFIG_KEY_MSG = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or "
    "'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
)
_FIELD_PATHS = (
    "metadata.annotations",
    "metadata.labels",
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
)
_NONNEGATIVE = "must be greater than or equal to 0"


def _supported(values: tuple[str, ...]) -> str:
    return "supported values: " + ", ".join(f'"{v}"' for v in values)


def _check_name(name: Any, path: str, errors: list[FieldError], *, label: bool = False) -> None:
    if not isinstance(name, str) or not name:
        errors.append(FieldError("Required value", path))
        return
    limit, pattern, message = (63, _LABEL, _LABEL_MSG) if label else (253, _SUBDOMAIN, _SUBDOMAIN_MSG)
    if len(name) > limit:
        errors.append(FieldError("Invalid value", path, name, f"must be no more than {limit} characters"))
    if not pattern.match(name):
        errors.append(FieldError("Invalid value", path, name, message))


def _check_labels(labels: Any, path: str, errors: list[FieldError]) -> None:
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if prefix and (len(prefix) > 253 or not _SUBDOMAIN.match(prefix)):
            errors.append(FieldError("Invalid value", path, key, "prefix part " + _SUBDOMAIN_MSG))
        if len(name) > 63:
            errors.append(
                FieldError("Invalid value", path, key, "name part must be no more than 63 characters")
            )
        elif not _NAME_PART.match(name):
            errors.append(FieldError("Invalid value", path, key, _NAME_PART_MSG))
        value = value or ""
        if len(value) > 63:
            errors.append(FieldError("Invalid value", path, value, "must be no more than 63 characters"))
        elif not _LABEL_VALUE.fullmatch(value):
            errors.append(FieldError("Invalid value", path, value, _LABEL_VALUE_MSG))


def _check_meta(obj: JsonObj, errors: list[FieldError]) -> None:
    metadata = obj.get("metadata") or {}
    if not metadata.get("name"):
        errors.append(
            FieldError("Required value", "metadata.name", detail="name or generateName is required")
        )
    else:
        _check_name(metadata.get("name"), "metadata.name", errors)
    _check_labels(metadata.get("labels"), "metadata.labels", errors)


def _check_env(env: list[Any], path: str, errors: list[FieldError]) -> None:
    for i, var in enumerate(env):
        here = f"{path}[{i}]"
        name = (var or {}).get("name")
        if not name:
            errors.append(FieldError("Required value", f"{here}.name"))
        elif not _ENV_NAME.match(name):
            errors.append(FieldError("Invalid value", f"{here}.name", name, _ENV_NAME_MSG))
        source = (var or {}).get("valueFrom")
        if not source:
            continue
        if var.get("value"):
            errors.append(
                FieldError(
                    "Invalid value", f"{here}.valueFrom", "", "may not be specified when `value` is not empty"
                )
            )
        kinds = [
            k for k in ("fieldRef", "secretKeyRef", "configMapKeyRef", "resourceFieldRef") if source.get(k)
        ]
        if len(kinds) != 1:
            detail = (
                "must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`"
            )
            if len(kinds) > 1:
                detail = "may not have more than one field specified at a time"
            errors.append(FieldError("Invalid value", f"{here}.valueFrom", "", detail))
            continue
        ref = source[kinds[0]]
        if kinds[0] == "fieldRef":
            field_path = ref.get("fieldPath") or ""
            base = re.sub(r"\['[^']*'\]$", "", field_path)
            if not field_path:
                errors.append(FieldError("Required value", f"{here}.valueFrom.fieldRef.fieldPath"))
            elif base not in _FIELD_PATHS or (base != field_path and base not in _FIELD_PATHS[:2]):
                errors.append(
                    FieldError(
                        "Unsupported value",
                        f"{here}.valueFrom.fieldRef.fieldPath",
                        field_path,
                        _supported(_FIELD_PATHS),
                    )
                )
        elif kinds[0] in ("secretKeyRef", "configMapKeyRef"):
            for key in ("name", "key"):
                if not ref.get(key):
                    errors.append(FieldError("Required value", f"{here}.valueFrom.{kinds[0]}.{key}"))


def _check_containers(spec: JsonObj, path: str, errors: list[FieldError]) -> None:
    volumes = {v.get("name") for v in spec.get("volumes") or [] if isinstance(v, dict)}
    seen: set[str] = set()
    for key in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(key) or []):
            here = f"{path}.{key}[{i}]"
            name = container.get("name")
            _check_name(name, f"{here}.name", errors, label=True)
            if name in seen:
                errors.append(FieldError("Duplicate value", f"{here}.name", name))
            seen.add(name)
            if not container.get("image"):
                errors.append(FieldError("Required value", f"{here}.image"))
            policy = container.get("terminationMessagePolicy")
            if policy not in (None, "File", "FallbackToLogsOnError"):
                errors.append(
                    FieldError(
                        "Unsupported value",
                        f"{here}.terminationMessagePolicy",
                        policy,
                        _supported(("File", "FallbackToLogsOnError")),
                    )
                )
            _check_env(container.get("env") or [], f"{here}.env", errors)
            for j, mount in enumerate(container.get("volumeMounts") or []):
                if mount.get("name") not in volumes:
                    errors.append(
                        FieldError("Not found", f"{here}.volumeMounts[{j}].name", mount.get("name"))
                    )
                if not mount.get("mountPath"):
                    errors.append(FieldError("Required value", f"{here}.volumeMounts[{j}].mountPath"))


def _check_pod_spec(spec: Any, path: str, errors: list[FieldError], *, restart: tuple[str, ...]) -> None:
    if not isinstance(spec, dict):
        errors.append(FieldError("Required value", path))
        return
    if not spec.get("containers"):
        errors.append(FieldError("Required value", f"{path}.containers"))
    names: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        _check_name(volume.get("name"), f"{path}.volumes[{i}].name", errors, label=True)
        if volume.get("name") in names:
            errors.append(FieldError("Duplicate value", f"{path}.volumes[{i}].name", volume.get("name")))
        names.add(volume.get("name"))
    _check_containers(spec, path, errors)
    policy = spec.get("restartPolicy")
    if policy not in restart:
        if len(restart) == 2:  # a Job's template: reported as "Required", as the 1.20 transcript shows
            detail = "valid values: " + ", ".join(f'"{v}"' for v in restart)
            errors.append(FieldError("Required value", f"{path}.restartPolicy", detail=detail))
        else:
            errors.append(
                FieldError("Unsupported value", f"{path}.restartPolicy", policy, _supported(restart))
            )
    for key in ("terminationGracePeriodSeconds", "activeDeadlineSeconds"):
        if isinstance(spec.get(key), int) and spec[key] < (0 if key.startswith("term") else 1):
            bound = _NONNEGATIVE if key.startswith("term") else "must be between 1 and 2147483647, inclusive"
            errors.append(FieldError("Invalid value", f"{path}.{key}", spec[key], bound))


def validate_pod(obj: JsonObj) -> list[FieldError]:
    errors: list[FieldError] = []
    _check_meta(obj, errors)
    _check_pod_spec(obj.get("spec"), "spec", errors, restart=("Always", "OnFailure", "Never"))
    return errors


def _check_pod_failure_policy(spec: JsonObj, errors: list[FieldError]) -> None:
    policy = spec.get("podFailurePolicy")
    if not policy:
        return
    template_spec = (spec.get("template") or {}).get("spec") or {}
    restart = template_spec.get("restartPolicy")
    if restart != "Never":
        detail = 'only "Never" is supported when podFailurePolicy is specified'
        errors.append(FieldError("Invalid value", "spec.template.spec.restartPolicy", restart, detail))
    for i, rule in enumerate(policy.get("rules") or []):
        path = f"spec.podFailurePolicy.rules[{i}]"
        action = rule.get("action")
        actions = ("Count", "FailIndex", "FailJob", "Ignore")
        if not action:
            errors.append(FieldError("Required value", f"{path}.action", detail=_supported(actions)))
        elif action not in actions:
            errors.append(FieldError("Unsupported value", f"{path}.action", action, _supported(actions)))
        on_codes, on_conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if bool(on_codes) == bool(on_conditions):
            detail = (
                "specifying both OnExitCodes and OnPodConditions is not supported"
                if on_codes
                else "specifying one of OnExitCodes and OnPodConditions is required"
            )
            errors.append(FieldError("Invalid value", path, None, detail))
        if on_codes:
            operator = on_codes.get("operator")
            if operator not in ("In", "NotIn"):
                where, supported = f"{path}.onExitCodes.operator", _supported(("In", "NotIn"))
                errors.append(FieldError("Unsupported value", where, operator, supported))
            values = on_codes.get("values") or []
            if not values:
                errors.append(FieldError("Required value", f"{path}.onExitCodes.values"))
            for j, value in enumerate(values):
                if value in values[:j]:
                    errors.append(FieldError("Duplicate value", f"{path}.onExitCodes.values[{j}]", value))
                if value == 0 and operator == "In":
                    detail = "must not be 0 for the In operator"
                    errors.append(
                        FieldError("Invalid value", f"{path}.onExitCodes.values[{j}]", value, detail)
                    )
        for j, pattern in enumerate(on_conditions or []):
            if not pattern.get("type"):
                errors.append(FieldError("Required value", f"{path}.onPodConditions[{j}].type"))
            if pattern.get("status", "True") not in ("True", "False", "Unknown"):
                errors.append(
                    FieldError(
                        "Unsupported value",
                        f"{path}.onPodConditions[{j}].status",
                        pattern.get("status"),
                        _supported(("True", "False", "Unknown")),
                    )
                )


def validate_job(obj: JsonObj) -> list[FieldError]:
    errors: list[FieldError] = []
    _check_meta(obj, errors)
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [*errors, FieldError("Required value", "spec")]
    for key in (
        "parallelism",
        "completions",
        "backoffLimit",
        "activeDeadlineSeconds",
        "ttlSecondsAfterFinished",
    ):
        if isinstance(spec.get(key), int) and spec[key] < 0:
            errors.append(FieldError("Invalid value", f"spec.{key}", spec[key], _NONNEGATIVE))
    template = spec.get("template")
    if not isinstance(template, dict):
        return [*errors, FieldError("Required value", "spec.template")]
    _check_labels((template.get("metadata") or {}).get("labels"), "spec.template.labels", errors)
    _check_pod_spec(template.get("spec"), "spec.template.spec", errors, restart=("OnFailure", "Never"))
    _check_pod_failure_policy(spec, errors)
    return errors


def validate_job_update(new: JsonObj, old: JsonObj) -> list[FieldError]:
    errors = validate_job(new)
    for key in ("template", "selector", "completions"):
        before, after = (old.get("spec") or {}).get(key), (new.get("spec") or {}).get(key)
        if before != after:
            errors.append(FieldError("Invalid value", f"spec.{key}", after, "field is immutable"))
    return errors


_POD_MUTABLE = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def _comparable_pod_spec(spec: JsonObj) -> JsonObj:
    spec = dict(spec)
    for key in ("containers", "initContainers"):
        spec[key] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get(key) or []]
    for key in ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"):
        spec.pop(key, None)
    return spec


def validate_pod_update(new: JsonObj, old: JsonObj) -> list[FieldError]:
    errors = validate_pod(new)
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    if _comparable_pod_spec(new_spec) != _comparable_pod_spec(old_spec):
        errors.append(FieldError("Forbidden", "spec", detail=_POD_MUTABLE))
    return errors


def validate_secret(obj: JsonObj) -> list[FieldError]:
    errors: list[FieldError] = []
    _check_meta(obj, errors)
    for key in obj.get("data") or {}:
        if not _CONFIG_KEY.match(key):
            errors.append(FieldError("Invalid value", f"data[{key}]", key, _CONFIG_KEY_MSG))
    return errors


def validate_secret_update(new: JsonObj, old: JsonObj) -> list[FieldError]:
    errors = validate_secret(new)
    if old.get("immutable") and (new.get("data") != old.get("data") or new.get("type") != old.get("type")):
        errors.append(FieldError("Forbidden", "data", detail="field is immutable when `immutable` is set"))
    return errors
