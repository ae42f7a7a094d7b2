"""Focused JSON schemas for the custom resources in deploy/ (ServiceMonitor, PodMonitor,
PrometheusRule, OpenShift SecurityContextConstraints).

The prometheus-operator and OpenShift CRD schemas are not available offline here, so these
schemas cover the fields deploy/ uses, with the CRDs' field names and types, and reject any
other field (`additionalProperties: false`): a misspelt or misplaced field fails instead of
being dropped silently by the API server's pruning.
"""

from __future__ import annotations

from typing import Any

STRING = {"type": "string"}
DURATION = {
    "type": "string",
    # The operator's Duration pattern.
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
    r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
LABELS = {"type": "object", "additionalProperties": STRING}


def _strict(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


METADATA = _strict(
    {"name": STRING, "namespace": STRING, "labels": LABELS, "annotations": LABELS}, ("name",)
)
SELECTOR = _strict({"matchLabels": LABELS})
RELABEL = _strict(
    {
        "sourceLabels": {
            "type": "array",
            "items": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"},
        },
        "separator": STRING,
        "targetLabel": STRING,
        "regex": STRING,
        "replacement": STRING,
        "action": {
            "enum": [
                "replace",
                "keep",
                "drop",
                "hashmod",
                "labelmap",
                "labeldrop",
                "labelkeep",
                "lowercase",
                "uppercase",
                "keepequal",
                "dropequal",
            ]
        },
    }
)
SECRET_KEY = _strict({"name": STRING, "key": STRING, "optional": {"type": "boolean"}}, ("key",))
TLS_CONFIG = _strict(
    {
        "ca": _strict({"secret": SECRET_KEY, "configMap": SECRET_KEY}),
        "cert": _strict({"secret": SECRET_KEY, "configMap": SECRET_KEY}),
        "keySecret": SECRET_KEY,
        "serverName": STRING,
        "insecureSkipVerify": {"type": "boolean"},
    }
)
BASIC_AUTH = _strict({"username": SECRET_KEY, "password": SECRET_KEY})
ENDPOINT = {
    "port": STRING,
    "tlsConfig": TLS_CONFIG,
    "basicAuth": BASIC_AUTH,
    "path": STRING,
    "scheme": {"enum": ["http", "https"]},
    "interval": DURATION,
    "scrapeTimeout": DURATION,
    "honorLabels": {"type": "boolean"},
    "relabelings": {"type": "array", "items": RELABEL},
    "metricRelabelings": {"type": "array", "items": RELABEL},
}
NAMESPACE_SELECTOR = _strict(
    {"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": STRING}}
)


def _resource(api: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return _strict(
        {"apiVersion": {"const": api}, "kind": {"const": kind}, "metadata": METADATA, "spec": spec},
        ("apiVersion", "kind", "metadata", "spec"),
    )


RULE = {
    "oneOf": [
        _strict(
            {"alert": STRING, "expr": STRING, "for": DURATION, "keep_firing_for": DURATION,
             "labels": LABELS, "annotations": LABELS},
            ("alert", "expr"),
        ),
        _strict({"record": STRING, "expr": STRING, "labels": LABELS}, ("record", "expr")),
    ]
}  # fmt: skip

SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _resource(
        "monitoring.coreos.com/v1",
        "ServiceMonitor",
        _strict(
            {
                "jobLabel": STRING,
                "selector": SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _strict(ENDPOINT, ("port",)),
                },
            },
            ("selector", "endpoints"),
        ),
    ),
    "PodMonitor": _resource(
        "monitoring.coreos.com/v1",
        "PodMonitor",
        _strict(
            {
                "jobLabel": STRING,
                "selector": SELECTOR,
                "namespaceSelector": NAMESPACE_SELECTOR,
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": _strict(ENDPOINT, ("port",)),
                },
            },
            ("selector", "podMetricsEndpoints"),
        ),
    ),
    "PrometheusRule": _resource(
        "monitoring.coreos.com/v1",
        "PrometheusRule",
        _strict(
            {
                "groups": {
                    "type": "array",
                    "items": _strict(
                        {
                            "name": STRING,
                            "interval": DURATION,
                            "rules": {"type": "array", "items": RULE},
                        },
                        ("name", "rules"),
                    ),
                }
            },
            ("groups",),
        ),
    ),
}

VOLUME_TYPES = ["hostPath", "emptyDir", "configMap", "secret", "projected", "downwardAPI",
                "persistentVolumeClaim", "ephemeral", "csi", "*"]  # fmt: skip
_STRATEGY = _strict(
    {"type": {"enum": ["RunAsAny", "MustRunAs", "MustRunAsRange", "MustRunAsNonRoot"]}}
)
SCHEMAS["SecurityContextConstraints"] = _strict(
    {
        "apiVersion": {"const": "security.openshift.io/v1"},
        "kind": {"const": "SecurityContextConstraints"},
        "metadata": METADATA,
        "priority": {"type": ["integer", "null"]},
        **{
            flag: {"type": "boolean"}
            for flag in (
                "allowHostDirVolumePlugin", "allowHostIPC", "allowHostNetwork", "allowHostPID",
                "allowHostPorts", "allowPrivilegeEscalation", "allowPrivilegedContainer",
                "readOnlyRootFilesystem",
            )
        },
        "allowedCapabilities": {"type": "array", "items": STRING},
        "defaultAddCapabilities": {"type": "array", "items": STRING},
        "requiredDropCapabilities": {"type": "array", "items": STRING},
        "fsGroup": _STRATEGY,
        "runAsUser": _STRATEGY,
        "seLinuxContext": _STRATEGY,
        "supplementalGroups": _STRATEGY,
        "seccompProfiles": {"type": "array", "items": STRING},
        "volumes": {"type": "array", "items": {"enum": VOLUME_TYPES}},
        "users": {"type": "array", "items": STRING},
        "groups": {"type": "array", "items": STRING},
    },
    ("apiVersion", "kind", "metadata", "priority", "runAsUser", "seLinuxContext"),
)  # fmt: skip
