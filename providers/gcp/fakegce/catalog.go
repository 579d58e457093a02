package fakegce

import "strings"

// MachineTypeSpec describes a machine type the fake serves. GPUType and
// GPUs are the built-in accelerators of A2/A3/G2 types (zero for N1 and
// other general-purpose types, to which GPUs are attached).
type MachineTypeSpec struct {
	Name     string
	VCPUs    int
	MemoryMb int
	GPUType  string
	GPUs     int
}

// AcceleratorTypeSpec describes an attachable accelerator type.
type AcceleratorTypeSpec struct {
	Name        string
	Description string
	MaxPerVM    int
}

// DefaultMachineTypes are the shapes of the real machine types (vCPUs,
// memory, built-in GPUs) that fleetd's provider deals with.
var DefaultMachineTypes = []MachineTypeSpec{
	{"a2-highgpu-1g", 12, 87040, "nvidia-tesla-a100", 1},
	{"a2-highgpu-2g", 24, 174080, "nvidia-tesla-a100", 2},
	{"a2-highgpu-4g", 48, 348160, "nvidia-tesla-a100", 4},
	{"a2-highgpu-8g", 96, 696320, "nvidia-tesla-a100", 8},
	{"a2-ultragpu-8g", 96, 1392640, "nvidia-a100-80gb", 8},
	{"a3-highgpu-8g", 208, 1916928, "nvidia-h100-80gb", 8},
	{"a3-megagpu-8g", 208, 1916928, "nvidia-h100-mega-80gb", 8},
	{"g2-standard-4", 4, 16384, "nvidia-l4", 1},
	{"g2-standard-8", 8, 32768, "nvidia-l4", 1},
	{"g2-standard-12", 12, 49152, "nvidia-l4", 1},
	{"g2-standard-16", 16, 65536, "nvidia-l4", 1},
	{"g2-standard-24", 24, 98304, "nvidia-l4", 2},
	{"g2-standard-32", 32, 131072, "nvidia-l4", 1},
	{"g2-standard-48", 48, 196608, "nvidia-l4", 4},
	{"g2-standard-96", 96, 393216, "nvidia-l4", 8},
	{"n1-standard-1", 1, 3840, "", 0},
	{"n1-standard-2", 2, 7680, "", 0},
	{"n1-standard-4", 4, 15360, "", 0},
	{"n1-standard-8", 8, 30720, "", 0},
	{"n1-standard-16", 16, 61440, "", 0},
	{"n1-standard-32", 32, 122880, "", 0},
	{"n1-standard-64", 64, 245760, "", 0},
	{"n1-standard-96", 96, 368640, "", 0},
	{"e2-standard-4", 4, 16384, "", 0},
}

// architecture is what GCE reports for a machine type: the Arm series
// (Tau T2A, Axion C4A, A4X with Grace CPUs) are ARM64, the rest X86_64.
func architecture(machineType string) string {
	for _, p := range []string{"t2a-", "c4a-", "a4x-"} {
		if strings.HasPrefix(machineType, p) {
			return "ARM64"
		}
	}
	return "X86_64"
}

// DefaultAcceleratorTypes are the attachable GPUs the fake serves.
var DefaultAcceleratorTypes = []AcceleratorTypeSpec{
	{"nvidia-tesla-t4", "NVIDIA T4", 4},
	{"nvidia-tesla-v100", "NVIDIA V100", 8},
	{"nvidia-tesla-p100", "NVIDIA Tesla P100", 4},
}
