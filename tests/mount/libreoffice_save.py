"""LibreOffice saving a spreadsheet as a user does, through UNO (tests/mount/versions.rs).

usage: python3 libreoffice_save.py FILE SAVES PORT PROFILE_DIR

Makes FILE (an .ods) if it is not there, then opens it, changes a cell and saves it SAVES times
(Ctrl+S: `store()`), each in a document of its own, with a headless soffice of its own.
"""
import os
import subprocess
import sys
import time

import uno
from com.sun.star.beans import PropertyValue

path, saves, port, profile = os.path.abspath(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
office = subprocess.Popen([
    "soffice", "--headless", "--invisible", "--norestore", "--nologo",
    "-env:UserInstallation=" + uno.systemPathToFileUrl(os.path.abspath(profile)),
    f"--accept=socket,host=127.0.0.1,port={port};urp;",
])
local = uno.getComponentContext()
resolver = local.ServiceManager.createInstanceWithContext("com.sun.star.bridge.UnoUrlResolver", local)
for _ in range(200):
    try:
        ctx = resolver.resolve(f"uno:socket,host=127.0.0.1,port={port};urp;StarOffice.ComponentContext")
        break
    except Exception:
        time.sleep(0.2)
else:
    sys.exit("soffice did not answer")
desktop = ctx.ServiceManager.createInstanceWithContext("com.sun.star.frame.Desktop", ctx)


def prop(name, value):
    p = PropertyValue()
    p.Name, p.Value = name, value
    return p


url = uno.systemPathToFileUrl(path)
hidden = (prop("Hidden", True),)
if not os.path.exists(path):
    doc = desktop.loadComponentFromURL("private:factory/scalc", "_blank", 0, hidden)
    doc.Sheets.getByIndex(0).getCellByPosition(0, 0).setString("made")
    doc.storeAsURL(url, (prop("FilterName", "calc8"),))
    doc.close(True)
for i in range(saves):
    doc = desktop.loadComponentFromURL(url, "_blank", 0, hidden)
    doc.Sheets.getByIndex(0).getCellByPosition(0, 0).setString(f"save {i + 1}")
    doc.store()
    doc.close(True)
try:
    desktop.terminate()
except Exception:
    pass  # the bridge goes with the office
office.wait(timeout=60)
