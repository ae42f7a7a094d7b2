"""The image test's harness: a Docker engine (Debian's docker.io), the Dockerfile's base
(or a stand-in built from Debian packages), the build, and the DaemonSet as `docker run`."""
