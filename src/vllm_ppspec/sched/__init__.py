"""The engine core's side: the plugin's schedulers (sync: PP batches in flight;
async: lanes) and the drafts carried in the runner's output."""
