// Package cputime reads CPU-time clocks, so that benchmarks on a shared machine
// can report throughput per CPU-second actually received next to wall time.
package cputime
