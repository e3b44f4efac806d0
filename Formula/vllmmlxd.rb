# vllmmlxd as a Homebrew formula. This repository is its own tap:
#   brew tap OWNER/vllmmlxd https://github.com/OWNER/vllmmlxd
#   brew install --HEAD vllmmlxd && brew services start vllmmlxd
# tests/unit/test_homebrew_formula.py evaluates this file on Linux with a stub of Homebrew's DSL.
class Vllmmlxd < Formula
  include Language::Python::Virtualenv

  desc "Serves local LLMs with MLX over OpenAI- and Anthropic-compatible APIs"
  homepage "https://github.com/OWNER/vllmmlxd"
  # No release is published yet, so there is no url/sha256: only `brew install --HEAD` works, from main.
  # A release adds `url ".../archive/refs/tags/vX.Y.Z.tar.gz"` and its `sha256` above this line.
  # OWNER stands for the account that publishes this repository: the URL `brew tap` is given.
  head "https://github.com/OWNER/vllmmlxd.git", branch: "main"
  license "Apache-2.0"

  # MLX's wheels are built for Apple silicon macOS only.
  depends_on arch: :arm64
  depends_on :macos
  depends_on "python@3.12"

  def install
    venv = virtualenv_create(libexec, "python3.12", system_site_packages: false)
    # A tap may do what homebrew-core does not: pip fetches the dependencies from PyPI as wheels at
    # install time (MLX publishes wheels only), instead of one checksummed `resource` per package.
    system "python3.12", "-m", "pip", "--python=#{venv.root}/bin/python", "install", buildpath
    bin.install_symlink libexec/"bin/vllmmlxd", libexec/"bin/vllmmlxctl"
    pkgshare.install "config/default.yaml", "config/vllmmlxd.example.yaml"
  end

  def post_install
    (etc/"vllmmlxd").mkpath
    (var/"vllmmlxd").mkpath
    (var/"log/vllmmlxd").mkpath
    config = etc/"vllmmlxd/config.yaml"
    return if config.exist? # the user's own by now: an upgrade never rewrites it

    # The project's default config (less its comments about a clone), with the state dir where
    # `vllmmlxctl` looks for Homebrew's daemon.
    header = <<~YAML
      # Written once by `brew install vllmmlxd`, kept across upgrades and uninstalls.
      # Check it with: vllmmlxctl check #{config}
      # Apply it with: vllmmlxctl reload
      # To serve another model, change `model:` (builtin:NAME, a .gguf path, an MLX folder or a
      # Hugging Face repo id); to serve more, add entries with their own ports. Every key:
      # #{opt_pkgshare}/vllmmlxd.example.yaml
      daemon:
        # Models, downloads and the control socket (control.sock) live here.
        state_dir: #{var}/vllmmlxd

    YAML
    body = (pkgshare/"default.yaml").readlines.drop_while { |l| l.start_with?("#") || l.strip.empty? }
    config.write(header + body.join)
  end

  # `brew services start vllmmlxd`: a LaunchAgent shaped as `vllmmlxctl install-service` writes one.
  service do
    run [opt_bin/"vllmmlxd", "run", "--config", etc/"vllmmlxd/config.yaml"]
    environment_variables PATH: std_service_path_env
    keep_alive successful_exit: false
    throttle_interval 10
    # Interactive: macOS must not throttle the GPU work as it would a background job.
    process_type :interactive
    working_dir var/"vllmmlxd"
    log_path var/"log/vllmmlxd/vllmmlxd.log"
    error_log_path var/"log/vllmmlxd/vllmmlxd.log"
  end

  test do
    assert_match "vllmmlxd", shell_output("#{bin}/vllmmlxd --version")
    assert_match "vllmmlxctl", shell_output("#{bin}/vllmmlxctl --version")
    (testpath/"config.yaml").write <<~YAML
      daemon:
        state_dir: #{testpath}/state
      models:
        tiny:
          model: builtin:tiny
          port: 18000
    YAML
    assert_match "ok (1 model: tiny)", shell_output("#{bin}/vllmmlxctl check #{testpath}/config.yaml")
  end
end
