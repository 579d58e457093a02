package stats

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/fleetd/fleetd/providers"
)

// regionOfOffering reads the region out of an Offering.Key()
// (provider/region/zone/type/capacity).
func regionOfOffering(key string) string {
	parts := strings.Split(key, "/")
	if len(parts) >= 2 {
		return parts[1]
	}
	return ""
}

// CallRegion is the region label of a provider call: the region the error
// names, else known (the offering's region for create and delete), else
// the one region the provider block spans (AWS regions, GCP zones), else
// "" for a call over several regions.
func CallRegion(err error, known string, cfg providers.Config) string {
	var pe *providers.Error
	if errors.As(err, &pe) && pe.Offering != "" {
		if r := regionOfOffering(pe.Offering); r != "" {
			return r
		}
	}
	if known != "" {
		return known
	}
	var raw struct {
		Regions []string `json:"regions"`
		Zones   []string `json:"zones"`
	}
	if len(cfg.Raw) == 0 || json.Unmarshal(cfg.Raw, &raw) != nil {
		return ""
	}
	seen := map[string]bool{}
	for _, r := range raw.Regions {
		seen[r] = true
	}
	for _, z := range raw.Zones {
		// A GCP zone is its region plus "-a", "-b", ...
		if i := strings.LastIndex(z, "-"); i > 0 {
			seen[z[:i]] = true
		}
	}
	if len(seen) != 1 {
		return ""
	}
	for r := range seen {
		return r
	}
	return ""
}
