"""The parts of Google resource names a class may write, shared by objects and selectors.

Segments are kept to what Google accepts, so a name can never smuggle a '/' or a host part. The
location ends up in a host name (the regional endpoint), hence its stricter pattern: a pod
author must not be able to send the pod's Google token to a host of their choosing.
"""

from __future__ import annotations

#: A project id or number, a secret, parameter or version id.
ID = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,254}"
#: Upstream's `locationLengthLimit` (util/constants.go): longer locations are refused.
MAX_LOCATION = 30
LOCATION = rf"[a-z][a-z0-9-]{{0,{MAX_LOCATION - 1}}}"
#: A secret id as Google allows it: letters, digits, '-' and '_', at most 255.
SHORT_ID = r"[A-Za-z0-9_-]{1,255}"
