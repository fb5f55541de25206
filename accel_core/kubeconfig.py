"""Load a kubeconfig the way every daemon names it: ``--kubeconfig``, else KUBECONFIG, else ~/.kube/config or
in-cluster (lightkube's order).

A file that is there but is no kubeconfig (``--kubeconfig /etc/passwd``: YAML that is a string, a directory, bytes
that are not text) raised whatever the parser met (AttributeError, ...); here it is :class:`KubeconfigError`, one
line naming the setting. "No configuration at all" stays lightkube's ConfigError (and a missing file its
FileNotFoundError): daemons that can run without an API server carry on then.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from lightkube.core.exceptions import ConfigError

if TYPE_CHECKING:
    from lightkube import KubeConfig


class KubeconfigError(ConfigError):
    """The kubeconfig a setting names cannot be used; the message names the setting and the file."""


def setting(kubeconfig: str | None) -> str:
    """How the user named the kubeconfig, for messages."""
    if kubeconfig:
        return f"--kubeconfig {kubeconfig}"
    env = os.environ.get("KUBECONFIG")
    return f"KUBECONFIG={env}" if env else "the kubeconfig (~/.kube/config or in-cluster)"


def load_kubeconfig(kubeconfig: str | None) -> KubeConfig:
    """lightkube's KubeConfig from ``kubeconfig`` (else the environment); KubeconfigError for an unusable file."""
    from lightkube import KubeConfig

    try:
        return KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_env()
    except (ConfigError, FileNotFoundError):
        raise
    except Exception as exc:  # the parser's own errors on content that is no kubeconfig
        raise KubeconfigError(f"{setting(kubeconfig)}: not a usable kubeconfig ({_reason(exc)})") from None


def _reason(exc: Exception) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    if isinstance(exc, AttributeError | TypeError | KeyError | IndexError):
        return "not a kubeconfig document"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}".rstrip(": ")
