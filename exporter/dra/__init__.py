"""Dynamic Resource Allocation: everything the exporter knows of DRA devices and claims.

`slices` parses ResourceSlices and DeviceTaintRules and `slicewatch` keeps this node's
current (`--kubernetes.dra`); `identity` ties a slice device to the device a source reads
and answers the join's questions about claimed devices; `claimhealth` and `extended` read
what the kubelet and the scheduler write into a pod's status; `view` is the cycle's step
that puts it all together. Without `--kubernetes.dra` only `identity`'s name-based join runs.
"""
