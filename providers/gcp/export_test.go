package gcp

// DescribeCredentials exposes describeCredentials to the external tests.
func DescribeCredentials(credJSON []byte, envFile string, envJSON []byte, adcFile string, adcJSON []byte) (source, principal string, metadata bool) {
	s := describeCredentials(credJSON, envFile, envJSON, adcFile, adcJSON)
	return s.source, s.principal, s.metadata
}

// MachineArch exposes machineArch to the external tests.
var MachineArch = machineArch
