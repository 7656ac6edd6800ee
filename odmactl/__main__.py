"""`python -m odmactl`: the same command line as the `odmactl` script (for an environment where the
package is on the path but not installed, e.g. a device machine with another Python)."""

from odmactl.launch import entry

if __name__ == "__main__":
    entry()
