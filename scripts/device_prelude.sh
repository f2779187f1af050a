# Sourced at the start of every device call: install the carried wheels, set paths.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
export TRITON_INTERPRET=0  # compiled kernels on the device, whatever the caller's shell says
# step NAME...: one line in the call's log ($LOG, when the script sets it) with the seconds so far.
step() { echo "=== $* (t=${SECONDS}s)" | tee -a "${LOG:-/dev/null}"; }
# fits LIMIT WHAT: whether a step of LIMIT seconds fits in what is left of the call's $TOTAL
# seconds (says so in the log when not)
fits() {
  local left=$(( ${TOTAL:?set TOTAL before fits} - SECONDS ))
  [ "$left" -gt "$1" ] && return 0
  echo "skipped (needs $1 s, $left s left): $2" | tee -a "${LOG:-/dev/null}"
  return 1
}
