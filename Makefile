# Every target does all the set-up it needs on a fresh Debian 12 machine (as root), and is quick
# when that is already done.
PY      := .venv/bin/python
APT_PKGS := mesa-vulkan-drivers libvulkan1 glslang-tools vulkan-validationlayers
STAMP   := .venv/.installed

.PHONY: setup demo test test-quick typecheck wheel-check info eval bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@command -v glslangValidator >/dev/null || { echo "glslangValidator still missing after install"; exit 1; }
	@[ -x $(PY) ] || python3 -m venv .venv
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

demo: setup
	$(PY) -m dsv4_vk demo

test: setup
	$(PY) -m pytest -q

# mypy over the package and tests/typecheck_api.py (the files and settings: pyproject.toml's [tool.mypy])
typecheck: setup
	$(PY) -m mypy

# the suite without its runs at the other lavapipe subgroup sizes, under the validation layer, on
# the staging path and of the GPU tools' dry runs (each a child process re-running many tests)
QUICK := not subgroup_size and not subgroup_sizes and not staging_path and not validation and not dry_run
test-quick: setup
	$(PY) -m pytest -q -k "$(QUICK)"

# build the wheel from the committed tree, install it in a fresh venv, run it without glslangValidator
wheel-check: setup
	bash tools/wheel_check.sh python3

info: setup
	$(PY) -m dsv4_vk info

eval: setup
	$(PY) -m dsv4_vk eval

bench: setup
	$(PY) -m dsv4_vk bench

clean:
	rm -rf .venv *.egg-info .pytest_cache .hypothesis build dist
