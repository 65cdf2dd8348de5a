"""Names of images: the Docker/OCI image reference grammar (distribution/reference), for
registry hosts, namespaces and image references named in matrix.yaml or the environment,
and the labels the images we build carry.

    reference := name [ ":" tag ] [ "@" digest ]
    name      := [ domain "/" ] path-component ( "/" path-component )*   (<= 255 chars)
"""

from __future__ import annotations

import re

from imagebuild.spec.values import BadValue

PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
HOST = rf"(?:{DOMAIN_COMPONENT}(?:\.{DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
DOMAIN = re.compile(rf"^{HOST}(?::(\d+))?\Z")
PATH = re.compile(rf"^{PATH_COMPONENT}(?:/{PATH_COMPONENT})*\Z")
TAG_CHARS = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"  # Docker's [\w][\w.-]{0,127}, ASCII \w
TAG = re.compile(rf"^{TAG_CHARS}\Z")
DIGEST_CHARS = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
DIGEST = re.compile(rf"^{DIGEST_CHARS}\Z")
NAME_MAX = 255
# the prefix of every label (and annotation) the images we build carry
LABEL_NS = "io.imagebuild"
# every image we build carries the digest of its inputs (recipe, patches, lock, base):
# build avoidance, the engine handoff's check and publish's record read it
INPUTS_LABEL = "io.imagebuild.inputs"

# The same grammars for the JSON Schema (spec/schemahint.py). A registry needs a '.' or
# ':' or is localhost (else Docker reads it as a Hub namespace), and its port is 1..65535;
# a reference's first component is a registry only when it looks like one.
PORT_JSON = (r"0*(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}"
             r"|655[0-2][0-9]|6553[0-5])")
REGISTRY_JSON = rf"^(?:localhost|(?=.*[.:]){HOST}(?::{PORT_JSON})?)$"
PATH_JSON = rf"^{PATH_COMPONENT}(?:/{PATH_COMPONENT})*$"
REFERENCE_JSON = (rf"^(?:(?:localhost|(?=[^/]*[.:]){HOST})(?::[0-9]+)?/)?"
                  rf"{PATH_COMPONENT}(?:/{PATH_COMPONENT})*(?::{TAG_CHARS})?(?:@{DIGEST_CHARS})?$")


def check_registry(value: str) -> str:
    """A registry host[:port] that Docker reads as a registry (not as a Hub namespace)."""
    if "://" in value:
        raise BadValue(f"registry {value!r} has a URL scheme",
                       f"give only host[:port], e.g. {value.split('://', 1)[1].rstrip('/')}")
    m = DOMAIN.match(value)
    if not m:
        raise BadValue(f"registry {value!r} is not a host[:port]",
                       "write a host name or IP with an optional port, e.g. 127.0.0.1:5000")
    if m.group(1) is not None and not 1 <= int(m.group(1)) <= 65535:
        raise BadValue(f"registry port {m.group(1)} is outside 1..65535",
                       "use the port the registry listens on")
    if not ("." in value or ":" in value or value == "localhost"):
        raise BadValue(f"registry {value!r} has no '.' or ':', so Docker would read it as a "
                       "namespace on Docker Hub", "write a full host name, or host:port")
    if len(value) > NAME_MAX:
        raise BadValue(f"registry name is {len(value)} characters", "use a shorter host name")
    return value


def check_path(value: str, what: str = "namespace") -> str:
    """Repository path components: lowercase letters and digits joined by '.', '_',
    '__' or dashes, separated by '/'."""
    if not PATH.match(value):
        raise BadValue(f"{what} {value!r} is not a valid repository path",
                       "use lowercase letters and digits, joined by '.', '_' or '-' "
                       "(not at the start or end), components separated by '/'")
    if len(value) > NAME_MAX:
        raise BadValue(f"{what} is {len(value)} characters (Docker allows {NAME_MAX} for "
                       "the whole name)", f"shorten the {what}")
    return value


def check_reference(value: str, what: str = "image") -> str:
    """A full image reference: [host[:port]/]path[:tag][@digest]."""
    fix = ("write an image reference such as nvcr.io/nvidia/cuda:13.0.1-devel-ubuntu24.04 "
           "(lowercase repository path, optional :tag and @sha256:digest)")
    name, _, digest = value.partition("@")
    if digest and not DIGEST.match(digest):
        raise BadValue(f"{what} {value!r} has a malformed digest", fix)
    head, slash, last = name.rpartition("/")
    tag = ""
    if ":" in last:
        last, tag = last.split(":", 1)
        if not TAG.match(tag):
            raise BadValue(f"{what} {value!r} has a malformed tag {tag!r}", fix)
    name = f"{head}{slash}{last}"
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        if not DOMAIN.match(first):
            raise BadValue(f"{what} {value!r} has a malformed registry host {first!r}", fix)
        path = rest
    else:
        path = name
    if not PATH.match(path):
        raise BadValue(f"{what} {value!r} is not a valid image reference", fix)
    if len(name) > NAME_MAX:
        raise BadValue(f"{what} name is {len(name)} characters (Docker allows {NAME_MAX})",
                       "use a shorter name")
    return value
