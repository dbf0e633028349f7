"""The profile database: devices, links, benchmark samples, run records and fitted models, shareable.

`ProfileDB` is the API every stage uses; `export`, `import_file` and `merge` move data between teams.
"""

from hetprof.profiles.db import DeviceInfo, ProfileDB
from hetprof.profiles.share import export, import_file, merge, read_export

__all__ = ["DeviceInfo", "ProfileDB", "export", "import_file", "merge", "read_export"]
