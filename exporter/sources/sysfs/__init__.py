"""What the sysfs sources (amdgpu, intel, rdma, netdev) share: the source base (`source`),
checked reads that count field errors instead of raising (`reader`), hwmon chips (`hwmon`)
and DRM fdinfo per process (`drmfdinfo`, amdgpu and i915/xe)."""
