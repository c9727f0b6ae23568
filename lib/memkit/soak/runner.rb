# frozen_string_literal: true

module Memkit
  module Soak
    # Drives the target, samples memory every sample_every requests and
    # builds the Result. In-process it forces a full GC before a sample so the
    # heap figures are live data, not garbage waiting for the next GC, but
    # only while those GCs stay under gc_budget of the run's time: a forced
    # GC costs milliseconds, which on a microsecond app would otherwise be
    # most of the run (bench/soak_overhead.rb).
    class Runner
      DEFAULT_REQUESTS = 20_000
      DEFAULT_SAMPLES = 200
      # Bytes per request under which growth is not called a leak; below it,
      # page-sized rss steps and malloc bookkeeping look like slow growth.
      DEFAULT_MIN_LEAK = 64
      BASELINE_SAMPLES = 12

      attr_reader :target, :requests, :sample_every, :warmup, :driver

      # target: path to a config.ru, or an http://127.0.0.1:PORT/path URL.
      # pid: the server's pid (URL targets only; its whole tree is sampled).
      # requests: how many to serve; sample_every: requests between samples
      # (default: requests / 200); warmup: requests before the fit window
      # (default: a fifth of requests), so caches and the heap can fill up.
      # path: PATH_INFO for config.ru targets. attribute: trace allocation
      # sites after the run (config.ru targets). progress: an IO to draw a
      # progress bar on (only drawn if it is a tty).
      def initialize(target, requests: DEFAULT_REQUESTS, sample_every: nil, warmup: nil, concurrency: 4, pid: nil,
                     path: "/", min_leak: DEFAULT_MIN_LEAK, gc_budget: 1.0, attribute: true, progress: nil)
        @target = target.to_s
        @url = Soak.url?(@target)
        @requests = positive!(requests, "requests")
        @sample_every =
          sample_every.nil? ? [@requests / DEFAULT_SAMPLES, 1].max : positive!(sample_every, "sample_every")
        if @sample_every > @requests
          raise InvalidArgument, "sample_every: #{@sample_every} is more than requests: #{@requests}"
        end

        @warmup = warmup.nil? ? @requests / 5 : number(:Integer, warmup, "warmup")
        unless (0...@requests).cover?(@warmup)
          raise InvalidArgument, "warmup: must be 0 or more and less than requests: #{@requests}, got #{@warmup}"
        end

        @concurrency = positive!(concurrency, "concurrency")
        raise InvalidArgument, "concurrency: #{@concurrency} is more than 256" if @concurrency > 256

        @min_leak = number(:Float, min_leak, "min_leak")
        raise InvalidArgument, "min_leak: must be 0 or more, got #{min_leak}" if @min_leak.negative?

        @gc_budget = number(:Float, gc_budget, "gc_budget")
        unless (0.0..1.0).cover?(@gc_budget)
          raise InvalidArgument, "gc_budget: must be between 0 and 1, got #{gc_budget}"
        end

        @attribute = attribute && !@url
        @progress = progress
        raise InvalidArgument, "#{@target} is a URL: pass the server's pid in pid:" if @url && pid.nil?
        raise InvalidArgument, "pid: is for URL targets; a config.ru runs in this process" if !@url && pid
        if !@url && concurrency != 4
          raise InvalidArgument, "concurrency: is for URL targets; a config.ru is driven one request at a time"
        end

        @pid = pid && ProcFS.pid!(pid)
        @path = path
      rescue ArgumentError, TypeError => e
        raise InvalidArgument, e.message
      end

      def run(&on_sample)
        sampler = @url ? TreeSampler.new(@pid) : SelfSampler.new
        @driver = @url ? UrlDriver.new(@target, concurrency: @concurrency) : RackDriver.new(@target, url_path: @path)
        baseline = @url ? nil : baseline(sampler)
        bar = Progress.new(@progress, total: @requests) if @progress
        log = SampleLog.new(@requests.fdiv(@sample_every).ceil + 1)
        started = now
        gc_seconds = 0.0
        last_gc = 0.0
        done = 0
        take = lambda do
          gc = false
          unless @url
            elapsed = now - started
            if log.size.zero? || @gc_budget >= 1.0 || gc_seconds + last_gc <= @gc_budget * elapsed
              t = now
              GC.start(full_mark: true, immediate_sweep: true)
              last_gc = now - t
              gc_seconds += last_gc
              gc = true
            end
          end
          sampler.record(log, done, now - started, gc: gc)
          # The Sample built for a callback is garbage by the next GC.
          if on_sample || bar
            sample = log.last
            on_sample&.call(sample)
            bar&.update(done, sample)
          end
        end
        take.call
        while done < @requests
          n = [@sample_every, @requests - done].min
          @driver.drive(n)
          done += n
          take.call
        end
        seconds = now - started
        bar&.finish
        attribution = Attribution.run(@driver, window: attribution_window) if @attribute
        Result.new(target: @target, mode: @url ? "url" : "rack", pid: sampler.pid, requests: @requests,
                   warmup: @warmup, sample_every: @sample_every, samples: log.to_a, seconds: seconds,
                   gc_seconds: gc_seconds, min_leak: @min_leak, malloc_source: sampler.malloc_source,
                   attribution: attribution, http_errors: @url ? @driver.errors : nil, baseline: baseline)
      ensure
        bar&.finish
        @driver&.close
      end

      private

      # The sampler measured with the app not called: BASELINE_SAMPLES samples
      # in a row, each after a full GC. Its growth per sample is what the
      # soak's own bookkeeping would add to the curve; Result reports it and
      # takes it out of the live fit.
      def baseline(sampler)
        log = SampleLog.new(BASELINE_SAMPLES)
        BASELINE_SAMPLES.times do |i|
          GC.start(full_mark: true, immediate_sweep: true)
          sampler.record(log, 0, i.to_f, gc: true)
        end
        log.to_a
      end

      def attribution_window = (@requests / 10).clamp([@sample_every, 100].min, 2_000)

      def number(kind, value, name)
        Kernel.public_send(kind, value)
      rescue ArgumentError, TypeError
        raise InvalidArgument, "#{name}: not a number: #{value.inspect}"
      end

      def positive!(value, name)
        n = Integer(value)
        raise InvalidArgument, "#{name}: must be a positive number, got #{value}" unless n.positive?

        n
      rescue ArgumentError, TypeError
        raise InvalidArgument, "#{name}: must be a positive number, got #{value.inspect}"
      end

      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end
  end
end
