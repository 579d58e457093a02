package agent

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/fleetd/fleetd/internal/ctxtime"
	"github.com/fleetd/fleetd/interruption/gcemeta"
	"github.com/fleetd/fleetd/interruption/imds"
)

// identity is what the node tells the daemon and the rendezvous about itself.
type identity struct {
	Addr       string // IP workers bind and peers reach (MASTER_ADDR on rank 0)
	Zone       string
	InstanceID string
	// Ifname is the network interface that carries Addr (GLOO_SOCKET_IFNAME).
	Ifname string
}

// metadataGetter reads one item of the instance metadata.
type metadataGetter func(ctx context.Context, item string) (string, error)

// Items asked of the metadata getters.
const (
	itemAddr     = "addr"
	itemZone     = "zone"
	itemInstance = "instance"
)

func (a *agent) metadataGetter() metadataGetter {
	u := a.metadataURL()
	switch a.opts.Config.Metadata.Kind {
	case MetadataAWSIMDS:
		c, _, err := imdsClient(u)
		if err != nil {
			return nil
		}
		paths := map[string]string{itemAddr: "meta-data/local-ipv4", itemZone: "meta-data/placement/availability-zone", itemInstance: imds.PathInstanceID}
		return func(ctx context.Context, item string) (string, error) {
			b, err := c.Get(ctx, paths[item])
			return strings.TrimSpace(string(b)), err
		}
	case MetadataGCE:
		c := gcemeta.NewClient(gceBaseURL(u))
		return func(ctx context.Context, item string) (string, error) {
			get := func(path string) ([]byte, error) {
				v, err := c.Get(ctx, path)
				return v.Body, err
			}
			switch item {
			case itemAddr:
				b, err := get("instance/network-interfaces/0/ip")
				return strings.TrimSpace(string(b)), err
			case itemZone:
				b, err := get(gcemeta.PathZone)
				if err != nil {
					return "", err
				}
				return gcemeta.ParseZone(b)
			}
			// The gcp provider names instances "ZONE/NAME": report that,
			// not the numeric id, so the daemon can match it.
			zb, err := get(gcemeta.PathZone)
			if err != nil {
				return "", err
			}
			nb, err := get(gcemeta.PathName)
			if err != nil {
				return "", err
			}
			zone, err := gcemeta.ParseZone(zb)
			if err != nil {
				return "", err
			}
			name, err := gcemeta.ParseName(nb)
			if err != nil {
				return "", err
			}
			return zone + "/" + name, nil
		}
	}
	return nil
}

// discoverIdentity finds the node's address (FLEETD_NODE_ADDR, else the
// metadata's private IP, else the first non-loopback IPv4), zone and
// instance id. Metadata is asked a few times: on a fresh VM it may answer
// a moment after the agent starts.
func (a *agent) discoverIdentity(ctx context.Context) identity {
	id := identity{Addr: a.opts.NodeAddr}
	get := a.metadataGetter()
	if get != nil {
		fetch := func(item string) string {
			var last error
			for attempt := range 3 {
				if attempt > 0 && ctxtime.Sleep(ctx, time.Duration(attempt)*500*time.Millisecond) != nil {
					return ""
				}
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				v, err := get(actx, item)
				cancel()
				if err == nil && v != "" {
					return v
				}
				if err == nil {
					err = errors.New("empty answer")
				}
				last = err
			}
			a.log.Warn("instance metadata unavailable", "item", item, "err", last)
			return ""
		}
		if id.Addr == "" {
			id.Addr = fetch(itemAddr)
		}
		id.Zone = fetch(itemZone)
		id.InstanceID = fetch(itemInstance)
	}
	if id.Addr == "" {
		id.Addr = firstIPv4()
	}
	id.Ifname = ifnameOf(id.Addr)
	return id
}

// firstIPv4 returns the first non-loopback IPv4 of an up interface.
func firstIPv4() string {
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, ad := range addrs {
			if ipn, ok := ad.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				return ipn.IP.String()
			}
		}
	}
	return ""
}

// ifnameOf names the interface that holds addr (or, for a loopback address
// such as the local provider's 127.0.10.N, the loopback interface, whose
// /8 covers it). Empty when none does.
func ifnameOf(addr string) string {
	ip := net.ParseIP(addr)
	if ip == nil {
		return ""
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, exact := range []bool{true, false} {
		for _, ifc := range ifs {
			addrs, _ := ifc.Addrs()
			for _, ad := range addrs {
				ipn, ok := ad.(*net.IPNet)
				if !ok {
					continue
				}
				if exact && ipn.IP.Equal(ip) {
					return ifc.Name
				}
				if !exact && ip.IsLoopback() && ifc.Flags&net.FlagLoopback != 0 && ipn.Contains(ip) {
					return ifc.Name
				}
			}
		}
	}
	return ""
}
