from labkube.cli import entry

entry()
