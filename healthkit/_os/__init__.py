"""The operating-system layer: what the kernel and the file system say, read and written
safely. ``/proc`` readers and pidfds (:mod:`.proc`), files at paths other users may control
(:mod:`.safefile`), this user's private directory (:mod:`.userdir`), dying with one's parent
(:mod:`.orphan`) and timeouts read from environment variables (:mod:`.bounds`). Nothing here
imports another healthkit layer except the errors."""
