// Command cdicheck loads CDI spec directories with tags.cncf.io/container-device-interface pkg/cdi, the library
// containerd injects CDI devices with, and fails on whatever that library refuses.
//
// Usage: cdicheck [--inject] [--device VENDOR/CLASS=NAME]... DIR...
//
// It loads every *.json and *.yaml spec in the directories into one cache (no watcher, one refresh), as containerd
// does, and reports each spec file's errors (parse, validation, version, conflicting device names). Each --device
// must resolve to a cached device; with --inject they are injected together into an empty OCI spec, as the runtime
// does for a container, and the resulting edits are printed. Device nodes the spec does not fully specify are looked
// up on this host, as containerd would. The report is one JSON document on stdout; the exit status is 1 when a
// spec was refused, a device did not resolve, injection failed, or no spec file was found, and 2 on bad usage.
package main

import (
	"encoding/json"

	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type deviceList []string

func (d *deviceList) String() string { return strings.Join(*d, ",") }

func (d *deviceList) Set(v string) error {
	*d = append(*d, v)
	return nil
}

// report is what the tool prints: the files that loaded, the errors per file, and the injection result.
type report struct {
	Specs      []specInfo          `json:"specs"`
	Errors     map[string][]string `json:"errors"`
	Unresolved []string            `json:"unresolved"`
	Injected   *injected           `json:"injected,omitempty"`
	InjectErr  string              `json:"injectError,omitempty"`
}

type specInfo struct {
	Path    string   `json:"path"`
	Kind    string   `json:"kind"`
	Version string   `json:"cdiVersion"`
	Devices []string `json:"devices"`
}

// injected is the part of the OCI spec that CDI edits change.
type injected struct {
	Env           []string                      `json:"env"`
	Devices       []oci.LinuxDevice             `json:"devices"`
	DeviceCgroup  []oci.LinuxDeviceCgroup       `json:"deviceCgroup"`
	Mounts        []oci.Mount                   `json:"mounts"`
	Hooks         *oci.Hooks                    `json:"hooks,omitempty"`
	NetDevices    map[string]oci.LinuxNetDevice `json:"netDevices,omitempty"`
	AdditionalGID []uint32                      `json:"additionalGids,omitempty"`
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("cdicheck", flag.ContinueOnError)
	var devices deviceList
	fs.Var(&devices, "device", "a fully qualified CDI device name the runtime would be given (repeatable)")
	inject := fs.Bool("inject", false, "inject the --device names into an empty OCI spec and print the edits")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	dirs := fs.Args()
	if len(dirs) == 0 {
		fmt.Fprintln(os.Stderr, "cdicheck: give at least one CDI spec directory")
		return 2
	}
	for _, dir := range dirs {
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			fmt.Fprintf(os.Stderr, "cdicheck: %s is not a directory\n", dir)
			return 2
		}
	}

	rep, failed := check(dirs, devices, *inject)
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", "  ")
	if err := out.Encode(rep); err != nil {
		fmt.Fprintf(os.Stderr, "cdicheck: %v\n", err)
		return 1
	}
	if failed {
		return 1
	}
	return 0
}

// check loads the directories into one cache and resolves (and optionally injects) the devices.
func check(dirs []string, devices []string, inject bool) (report, bool) {
	rep := report{Errors: map[string][]string{}, Unresolved: []string{}, Specs: []specInfo{}}
	cache, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	failed := false
	for path, errs := range cache.GetErrors() {
		for _, err := range errs {
			rep.Errors[path] = append(rep.Errors[path], err.Error())
			failed = true
		}
	}
	for _, vendor := range cache.ListVendors() {
		for _, spec := range cache.GetVendorSpecs(vendor) {
			info := specInfo{Path: spec.GetPath(), Kind: spec.Kind, Version: spec.Version}
			for _, d := range spec.Devices {
				info.Devices = append(info.Devices, spec.Kind+"="+d.Name)
			}
			rep.Specs = append(rep.Specs, info)
		}
	}
	sort.Slice(rep.Specs, func(i, j int) bool { return rep.Specs[i].Path < rep.Specs[j].Path })
	if len(rep.Specs) == 0 && len(rep.Errors) == 0 {
		rep.Errors[strings.Join(dirs, ",")] = []string{"no CDI spec file (*.json, *.yaml) found"}
		failed = true
	}
	for _, name := range devices {
		if cache.GetDevice(name) == nil {
			rep.Unresolved = append(rep.Unresolved, name)
			failed = true
		}
	}
	if inject && len(rep.Unresolved) == 0 {
		spec := emptyOCISpec()
		if _, err := cache.InjectDevices(spec, devices...); err != nil {
			rep.InjectErr = err.Error()
			failed = true
		} else {
			rep.Injected = edited(spec)
		}
	}
	return rep, failed
}

// emptyOCISpec is a container spec with nothing in it yet, for a root user (no uid/gid filled into devices).
func emptyOCISpec() *oci.Spec {
	return &oci.Spec{
		Version: oci.Version,
		Process: &oci.Process{Cwd: "/", Args: []string{"/bin/true"}},
		Root:    &oci.Root{Path: filepath.Join(os.TempDir(), "rootfs")},
		Linux:   &oci.Linux{Resources: &oci.LinuxResources{}},
	}
}

func edited(spec *oci.Spec) *injected {
	out := &injected{Env: spec.Process.Env, Mounts: spec.Mounts, Hooks: spec.Hooks,
		AdditionalGID: spec.Process.User.AdditionalGids}
	if spec.Linux != nil {
		out.Devices = spec.Linux.Devices
		out.NetDevices = spec.Linux.NetDevices
		if spec.Linux.Resources != nil {
			out.DeviceCgroup = spec.Linux.Resources.Devices
		}
	}
	if out.Env == nil {
		out.Env = []string{}
	}
	return out
}
