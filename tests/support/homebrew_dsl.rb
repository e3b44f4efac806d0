# A stand-in for the part of Homebrew's formula DSL that Formula/vllmmlxd.rb uses, so that a test on
# Linux can evaluate the formula under a fake prefix. Usage:
#   ruby homebrew_dsl.rb FORMULA PREFIX BUILDPATH TESTPATH PHASE...   (install, post_install, service, test)
# prints one JSON object: the formula's declarations and what each phase did.
# Unknown DSL methods raise, as they would in Homebrew; `system` in install is recorded, not run.
require "fileutils"
require "json"
require "open3"
require "pathname"

# Homebrew's own additions to Pathname that the formula uses.
class Pathname
  # Copies (Homebrew moves) files from the build dir into this folder.
  def install(*sources)
    mkpath
    sources.flatten.each { |s| FileUtils.cp_r(s.to_s, (self / File.basename(s.to_s)).to_s) }
  end

  def install_symlink(*targets)
    mkpath
    targets.flatten.each do |t|
      link = self / File.basename(t.to_s)
      FileUtils.ln_sf(t.to_s, link.to_s)
      Formula::RECORD[:symlinks] << { link: link.to_s, target: t.to_s }
    end
  end
end

module Language
  module Python
    # Records the virtualenv it is asked for; pip is never run here.
    module Virtualenv
      Venv = Struct.new(:root)

      def virtualenv_create(venv_root, python = "python", system_site_packages: true, without_pip: true)
        Formula::RECORD[:virtualenv] = {
          root: venv_root.to_s, python: python.to_s,
          system_site_packages: system_site_packages, without_pip: without_pip
        }
        Venv.new(Pathname(venv_root))
      end
    end
  end
end

# The `service do` block's DSL: what Homebrew::Service accepts, and the formula paths it delegates.
class Service
  KEEP_ALIVE_KEYS = [:always, :successful_exit, :crashed, :path].freeze
  PROCESS_TYPES = [:background, :standard, :interactive, :adaptive].freeze
  DELEGATED = [:bin, :etc, :libexec, :opt_bin, :opt_libexec, :opt_pkgshare, :opt_prefix, :opt_sbin, :var].freeze

  attr_reader :spec

  def initialize(formula, &block)
    @formula = formula
    @spec = { run_at_load: true }
    instance_eval(&block)
  end

  DELEGATED.each { |name| define_method(name) { @formula.public_send(name) } }

  def std_service_path_env
    "#{Formula.homebrew_prefix}/bin:#{Formula.homebrew_prefix}/sbin:/usr/bin:/bin:/usr/sbin:/sbin"
  end

  def run(command)
    @spec[:run] = Array(command).map(&:to_s)
  end

  def environment_variables(variables)
    @spec[:environment_variables] = variables.transform_values(&:to_s)
  end

  def keep_alive(value)
    value = { always: value } if [true, false].include?(value)
    raise TypeError, "keep_alive only allows #{KEEP_ALIVE_KEYS}" unless (value.keys - KEEP_ALIVE_KEYS).empty?

    @spec[:keep_alive] = value
  end

  def process_type(value)
    raise TypeError, "process_type allows #{PROCESS_TYPES}" unless PROCESS_TYPES.include?(value)

    @spec[:process_type] = value
  end

  def throttle_interval(value)
    raise TypeError, "throttle_interval takes an Integer" unless value.is_a?(Integer)

    @spec[:throttle_interval] = value
  end

  [:working_dir, :log_path, :error_log_path, :run_at_load].each do |name|
    define_method(name) { |value| @spec[name] = value.is_a?(Pathname) ? value.to_s : value }
  end
end

# The formula base class: class-level declarations, and the paths of a keg under the fake prefix.
class Formula
  RECORD = { system: [], symlinks: [] }

  class << self
    attr_accessor :homebrew_prefix, :subclass

    def inherited(subclass)
      super
      Formula.subclass = subclass
    end

    def spec
      @spec ||= { depends_on: [] }
    end

    [:desc, :homepage, :license, :url, :sha256].each do |name|
      define_method(name) { |value| spec[name] = value }
    end

    def head(url, branch: nil)
      spec[:head] = { url: url, branch: branch }
    end

    def depends_on(dep)
      spec[:depends_on] << dep
    end

    def service(&block)
      @service_block = block
    end

    def test(&block)
      @test_block = block
    end

    attr_reader :service_block, :test_block
  end

  attr_accessor :phase, :buildpath, :testpath

  def name
    self.class.name.downcase
  end

  def homebrew_prefix = Pathname(Formula.homebrew_prefix)
  def prefix = homebrew_prefix/"Cellar"/name/"HEAD"
  def opt_prefix = homebrew_prefix/"opt"/name
  def bin = prefix/"bin"
  def libexec = prefix/"libexec"
  def pkgshare = prefix/"share"/name
  def opt_bin = opt_prefix/"bin"
  def opt_libexec = opt_prefix/"libexec"
  def opt_pkgshare = opt_prefix/"share"/name
  def opt_sbin = opt_prefix/"sbin"
  def etc = homebrew_prefix/"etc"
  def var = homebrew_prefix/"var"

  # Recorded while installing (nothing is fetched); run for real by the test block.
  def system(*args)
    args = args.map(&:to_s)
    return RECORD[:system] << args if phase == :install

    raise "failed: #{args.join(" ")}" unless Kernel.system(*args)
  end

  def shell_output(command, status = 0)
    out, code = Open3.capture2e(command)
    raise "#{command} exited #{code.exitstatus}, not #{status}: #{out}" if code.exitstatus != status

    out
  end

  def assert_match(expected, actual)
    found = expected.is_a?(Regexp) ? expected.match?(actual) : actual.include?(expected)
    raise "expected #{expected.inspect} in #{actual.inspect}" unless found
  end
end

formula_file, prefix, buildpath, testpath, *phases = ARGV
Formula.homebrew_prefix = prefix
load formula_file
formula = Formula.subclass.new
formula.buildpath = Pathname(buildpath)
formula.testpath = Pathname(testpath)
out = { class: Formula.subclass.name, name: formula.name, spec: Formula.subclass.spec }
phases.each do |phase|
  formula.phase = phase.to_sym
  case phase
  when "install"
    Dir.chdir(buildpath) { formula.install }
    out[:install] = { virtualenv: Formula::RECORD[:virtualenv], system: Formula::RECORD[:system],
                      symlinks: Formula::RECORD[:symlinks] }
  when "post_install"
    formula.post_install
    out[:post_install] = { config: (formula.etc/"vllmmlxd/config.yaml").to_s }
  when "service"
    out[:service] = Service.new(formula, &Formula.subclass.service_block).spec
  when "test"
    Dir.chdir(testpath) { formula.instance_eval(&Formula.subclass.test_block) }
    out[:test] = "passed"
  else
    raise ArgumentError, "unknown phase #{phase}"
  end
end
puts JSON.generate(out)
