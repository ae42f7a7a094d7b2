"""The kubelet side: PodResources v1 / v1alpha1 over the kubelet's unix socket."""

from exporter.podresources.client import PodResourcesClient, PodResourcesError

__all__ = ["PodResourcesClient", "PodResourcesError"]
