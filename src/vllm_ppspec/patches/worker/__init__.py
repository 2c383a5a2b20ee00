"""The worker group: what the plugin's worker installs at init_device."""
