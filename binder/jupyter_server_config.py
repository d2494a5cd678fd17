# Jupyter server settings for a Binder launch (postBuild copies this file into the Jupyter config folder).
#
# Why: Binder guarantees about 1 GB of memory, and JupyterLab keeps a notebook's kernel alive after the
# learner moves on to the next tutorial, so two tutorials' kernels already pass it. Each tutorial ends by
# asking the learner to shut its kernel down; this is the safety net for when they do not.
c = get_config()  # noqa: F821  (traitlets provides get_config when it loads this file)

# A kernel that has run nothing for 10 minutes is shut down (its memory comes back), even while its
# notebook tab is still open: JupyterLab keeps every opened notebook connected.
c.MappingKernelManager.cull_idle_timeout = 600
c.MappingKernelManager.cull_interval = 60
c.MappingKernelManager.cull_connected = True
# A kernel that is busy (a long cell) is never culled.
c.MappingKernelManager.cull_busy = False
