"""Offline emulator of Cursor's `agent acp` (see provider_packs/cursor-emulator/README.md).

Plain stdlib only: it runs as Debian's /usr/bin/python3 inside the sandbox.
"""
