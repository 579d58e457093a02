package gcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	compute "cloud.google.com/go/compute/apiv1"
	"cloud.google.com/go/compute/apiv1/computepb"
	"github.com/fleetd/fleetd/providers"
	"github.com/googleapis/gax-go/v2/apierror"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
	htransport "google.golang.org/api/transport/http"
)

// Public endpoints of the APIs the preflight uses besides Compute Engine.
const (
	ResourceManagerEndpoint = "https://cloudresourcemanager.googleapis.com/"
	IAMEndpoint             = "https://iam.googleapis.com/"
)

const quotasPage = "https://console.cloud.google.com/iam-admin/quotas"

var _ providers.Checker = (*Provider)(nil)

// Check verifies, launching nothing, that the block's project is ready:
// credentials, project, image, zones, machine and accelerator types,
// regional quotas against opts.TargetNodes, and the IAM permissions
// fleetd's calls need. Every failed call becomes a row; only an invalid
// block is an error. Rows come in a fixed order: credentials, project,
// image, then per zone, quotas (global, then per region), permissions and
// prices.
func (p *Provider) Check(ctx context.Context, cfg providers.Config, opts providers.CheckOptions) ([]providers.CheckResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := decodeConfig(cfg)
	if err != nil {
		return nil, err
	}
	k := &checker{p: p, c: c, quick: opts.Quick, nodes: max(opts.TargetNodes, 1), network: opts.Network, fileSystems: opts.FileSystems}
	k.run(ctx)
	return k.rows, nil
}

// checker holds one preflight run.
type checker struct {
	p     *Provider
	c     *config
	quick bool
	nodes int
	// network: the fleet uses the fast network (networkRows).
	network bool
	// fileSystems are the fleet's datasets to verify (filestoreRows).
	fileSystems []providers.FileSystemCheck

	// principal is the IAM member the credentials act as
	// ("serviceAccount:x@p.iam.gserviceaccount.com"), "" when unknown.
	principal string
	cl        checkClients
	project   *computepb.Project
	rows      []providers.CheckResult
}

type checkClients struct {
	projects *compute.ProjectsClient
	zones    *compute.ZonesClient
	regions  *compute.RegionsClient
	images   *compute.ImagesClient
	mts      *compute.MachineTypesClient
	accels   *compute.AcceleratorTypesClient
	subnets  *compute.SubnetworksClient
}

func (k *checker) add(r providers.CheckResult) { k.rows = append(k.rows, r) }

func (k *checker) run(ctx context.Context) {
	if !k.credentials(ctx) {
		return
	}
	if err := k.newClients(ctx); err != nil {
		k.add(providers.CheckResult{Check: "clients", Status: providers.CheckFailed,
			Detail: "could not build the Compute Engine clients: " + err.Error(), Fix: credentialsFix})
		return
	}
	defer k.closeClients()
	projectOK := k.checkProject(ctx)
	k.checkImage(ctx)
	if !projectOK {
		return
	}
	facts := k.sweepZones(ctx)
	k.zoneRows(facts)
	if k.quick {
		return
	}
	k.quotaRows(ctx, facts)
	if k.network {
		k.networkRows(ctx)
	}
	k.filestoreRows(ctx)
	k.permissionRows(ctx)
	k.pricesRow(ctx)
}

// --- credentials ---------------------------------------------------------

const credentialsFix = "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or run fleetd on a GCE VM with a service account"

// credentials reports where the clients' credentials come from and that
// they yield a token; false means nothing else can be checked.
func (k *checker) credentials(ctx context.Context) bool {
	if plainHTTP(k.c.Endpoint) {
		k.add(providers.CheckResult{Check: "credentials", Status: providers.CheckOK,
			Detail: fmt.Sprintf("none needed: endpoint %s is plain http (a local fake or proxy), so no credentials are sent", k.c.Endpoint)})
		return true
	}
	if len(k.p.opts.ClientOptions) > 0 {
		// Options cannot be inspected; building the clients next proves
		// they carry usable credentials.
		k.add(providers.CheckResult{Check: "credentials", Status: providers.CheckOK,
			Detail: "supplied by the provider's client options"})
		return true
	}
	// The block's scopes are the nodes'; fleetd's own calls use cloud-platform.
	creds, err := google.FindDefaultCredentials(ctx, DefaultScope)
	if err != nil {
		k.add(providers.CheckResult{Check: "credentials", Status: providers.CheckFailed,
			Detail: "no credentials found (other checks skipped): " + err.Error(), Fix: credentialsFix})
		return false
	}
	envFile := os.Getenv("GOOGLE_APPLICATION_CREDENTIALS")
	src := describeCredentials(creds.JSON, envFile, fileBytes(envFile), gcloudADCFile(), fileBytes(gcloudADCFile()))
	k.principal = src.principal
	if src.metadata {
		k.principal = metadataPrincipal(ctx)
	}
	detail := src.source
	if k.principal != "" {
		detail += ", acting as " + k.principal
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := tokenWithContext(tctx, creds.TokenSource.Token); err != nil {
		k.add(providers.CheckResult{Check: "credentials", Status: providers.CheckFailed,
			Detail: detail + ", but no access token: " + err.Error(), Fix: src.fix})
		return false
	}
	k.add(providers.CheckResult{Check: "credentials", Status: providers.CheckOK, Detail: detail})
	return true
}

// tokenWithContext bounds a token fetch, which takes no context.
func tokenWithContext[T any](ctx context.Context, f func() (T, error)) (T, error) {
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	go func() { v, err := f(); ch <- res{v, err} }()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// credSource says where credentials came from, whom they act as, and how
// to repair them.
type credSource struct {
	source    string
	principal string
	fix       string
	metadata  bool
}

// describeCredentials names the source of the credentials whose JSON (nil
// for the metadata server) is credJSON, the way Application Default
// Credentials finds them: the GOOGLE_APPLICATION_CREDENTIALS file, then
// gcloud's ADC file, then the metadata server. The library reads the
// files itself and does not say which it used, so contents are compared.
func describeCredentials(credJSON []byte, envFile string, envJSON []byte, adcFile string, adcJSON []byte) credSource {
	var s credSource
	switch {
	case len(credJSON) == 0:
		s.source = "the GCE metadata server (the VM's service account)"
		s.metadata = true
		s.fix = "give the VM a service account with the cloud-platform scope (gcloud compute instances set-service-account)"
		return s
	case envFile != "" && bytes.Equal(credJSON, envJSON):
		s.source = "GOOGLE_APPLICATION_CREDENTIALS file " + envFile
	case adcFile != "" && bytes.Equal(credJSON, adcJSON):
		s.source = "gcloud application-default credentials file " + adcFile
	default:
		s.source = "Application Default Credentials"
	}
	var f struct {
		Type                           string `json:"type"`
		ClientEmail                    string `json:"client_email"`
		ServiceAccountImpersonationURL string `json:"service_account_impersonation_url"`
	}
	_ = json.Unmarshal(credJSON, &f)
	switch f.Type {
	case "service_account":
		s.source += " (service account key)"
		if f.ClientEmail != "" {
			s.principal = "serviceAccount:" + f.ClientEmail
		}
		s.fix = "the key may be deleted or disabled: create a new one (gcloud iam service-accounts keys create)"
	case "authorized_user":
		s.source += " (user credentials)"
		s.fix = "run `gcloud auth application-default login` again"
	case "impersonated_service_account", "external_account":
		if f.Type == "external_account" {
			s.source += " (workload identity federation)"
		} else {
			s.source += " (service account impersonation)"
		}
		if email := impersonatedEmail(f.ServiceAccountImpersonationURL); email != "" {
			s.principal = "serviceAccount:" + email
		}
		s.fix = "check that the impersonated service account exists and grants roles/iam.serviceAccountTokenCreator to the caller"
	default:
		s.fix = credentialsFix
	}
	return s
}

var impersonationRE = regexp.MustCompile(`/serviceAccounts/([^/:]+):generateAccessToken$`)

func impersonatedEmail(u string) string {
	if m := impersonationRE.FindStringSubmatch(u); m != nil {
		return m[1]
	}
	return ""
}

// gcloudADCFile is where `gcloud auth application-default login` writes.
func gcloudADCFile() string {
	const f = "application_default_credentials.json"
	if runtime.GOOS == "windows" {
		return filepath.Join(os.Getenv("APPDATA"), "gcloud", f)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".config", "gcloud", f)
}

func fileBytes(name string) []byte {
	if name == "" {
		return nil
	}
	b, _ := os.ReadFile(name)
	return b
}

// metadataPrincipal asks the metadata server which service account the VM
// runs as; "" when it does not answer.
func metadataPrincipal(ctx context.Context) string {
	host := os.Getenv("GCE_METADATA_HOST")
	if host == "" {
		host = "169.254.169.254"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/computeMetadata/v1/instance/service-accounts/default/email", nil)
	if err != nil {
		return ""
	}
	req.Header.Set("Metadata-Flavor", "Google")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if err != nil || resp.StatusCode != http.StatusOK {
		return ""
	}
	return "serviceAccount:" + strings.TrimSpace(string(b))
}

// who names the principal in a fix's prose; member is its --member flag
// value, a placeholder when the credentials do not say.
func (k *checker) who() string {
	if k.principal != "" {
		return k.principal
	}
	return "the account fleetd runs as"
}

func (k *checker) member() string {
	if k.principal != "" {
		return k.principal
	}
	return "MEMBER"
}

// grantFix is the fix for a role missing on the project.
func (k *checker) grantFix(role string) string {
	return fmt.Sprintf("grant %s to %s: gcloud projects add-iam-policy-binding %s --member=%s --role=%s", role, k.who(), k.c.Project, k.member(), role)
}

func (k *checker) newClients(ctx context.Context) error {
	b := &clientBuilder{ctx: ctx, opts: k.p.clientOptions(k.c)}
	k.cl = checkClients{
		projects: build(b, "projects", compute.NewProjectsRESTClient),
		zones:    build(b, "zones", compute.NewZonesRESTClient),
		regions:  build(b, "regions", compute.NewRegionsRESTClient),
		images:   build(b, "images", compute.NewImagesRESTClient),
		mts:      build(b, "machine types", compute.NewMachineTypesRESTClient),
		accels:   build(b, "accelerator types", compute.NewAcceleratorTypesRESTClient),
		subnets:  build(b, "subnetworks", compute.NewSubnetworksRESTClient),
	}
	if b.err != nil {
		return fmt.Errorf("%s: %w", b.failed, b.err)
	}
	return nil
}

func (k *checker) closeClients() {
	for _, c := range []interface{ Close() error }{k.cl.projects, k.cl.zones, k.cl.regions, k.cl.images, k.cl.mts, k.cl.accels, k.cl.subnets} {
		if c != nil {
			_ = c.Close()
		}
	}
}

// --- call errors -----------------------------------------------------------

// notFound is the detail and fix of a row whose call answered 404.
type notFound struct{ detail, fix string }

// errRow turns a failed Compute Engine call into a row.
func (k *checker) errRow(check, scope string, err error, nf notFound) providers.CheckResult {
	r := providers.CheckResult{Check: check, Scope: scope, Status: providers.CheckFailed}
	var ge *googleapi.Error
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		r.Status, r.Detail, r.Fix = providers.CheckUnavailable, "not checked: "+err.Error(), "run the check again with more time"
	case !errors.As(err, &ge):
		r.Status, r.Detail = providers.CheckUnavailable, "no answer from Compute Engine: "+err.Error()
		r.Fix = "check network access to " + k.computeEndpoint() + " and retry"
	case ge.Code == http.StatusNotFound:
		r.Detail, r.Fix = nf.detail+": "+ge.Message, nf.fix
	case ge.Code == http.StatusUnauthorized:
		r.Detail, r.Fix = "credentials rejected: "+ge.Message, credentialsFix
	case ge.Code == http.StatusForbidden && apiDisabled(ge.Message, reasons(ge)):
		r.Detail = "the Compute Engine API is not enabled: " + ge.Message
		r.Fix = "gcloud services enable compute.googleapis.com --project " + k.c.Project
	case ge.Code == http.StatusForbidden:
		r.Detail = "denied: " + ge.Message
		r.Fix = k.grantFix(roleInstanceAdmin)
	case ge.Code == http.StatusTooManyRequests || ge.Code >= 500:
		r.Status, r.Detail, r.Fix = providers.CheckUnavailable, fmt.Sprintf("Compute Engine answered %d: %s", ge.Code, ge.Message), "retry in a minute"
	default:
		r.Detail = fmt.Sprintf("Compute Engine answered %d: %s", ge.Code, ge.Message)
	}
	return r
}

func reasons(ge *googleapi.Error) []string {
	var out []string
	for _, it := range ge.Errors {
		out = append(out, it.Reason)
	}
	return out
}

// apiDisabled recognises "API not enabled" in either error shape: the
// googleapi reason accessNotConfigured, or ErrorInfo SERVICE_DISABLED.
func apiDisabled(msg string, reasons []string) bool {
	for _, r := range reasons {
		if r == "accessNotConfigured" || r == "SERVICE_DISABLED" {
			return true
		}
	}
	return strings.Contains(msg, "has not been used in project") || strings.Contains(msg, "it is disabled")
}

// projectMissing reports whether a projects.get error means no other
// project-scoped call can succeed.
func projectMissing(err error) bool {
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		return false
	}
	return ge.Code == http.StatusNotFound || (ge.Code == http.StatusForbidden && apiDisabled(ge.Message, reasons(ge)))
}

func (k *checker) computeEndpoint() string {
	if k.c.Endpoint != "" {
		return k.c.Endpoint
	}
	return "https://compute.googleapis.com"
}

// --- project and image -------------------------------------------------------

// checkProject reads the project; false means the project-scoped checks
// would only repeat its failure.
func (k *checker) checkProject(ctx context.Context) bool {
	pr, err := k.cl.projects.Get(ctx, &computepb.GetProjectRequest{Project: k.c.Project})
	if err != nil {
		r := k.errRow("project", "", err, notFound{
			detail: fmt.Sprintf("project %q not found", k.c.Project),
			fix:    "set project to an existing project id (gcloud projects list)",
		})
		if projectMissing(err) {
			r.Detail += " (zone, machine type, quota and permission checks skipped)"
			k.add(r)
			return false
		}
		k.add(r)
		return true
	}
	k.project = pr
	k.add(providers.CheckResult{Check: "project", Status: providers.CheckOK,
		Detail: fmt.Sprintf("project %s (number %d) is reachable", pr.GetName(), pr.GetId())})
	return true
}

// imageRE splits an image reference: an optional API URL prefix, an
// optional project, then an image name or a family.
var imageRE = regexp.MustCompile(`^(?:https://[^/]+/compute/(?:v1|beta|alpha)/)?(?:projects/([^/]+)/)?global/images/(?:family/([^/]+)|([^/]+))$`)

// imageRef parses the block's image; ok is false when it is not an image
// or image family path.
func (c *config) imageRef() (project, family, name string, ok bool) {
	m := imageRE.FindStringSubmatch(c.Image)
	if m == nil {
		return "", "", "", false
	}
	project = m[1]
	if project == "" {
		project = c.Project
	}
	return project, m[2], m[3], true
}

func (k *checker) checkImage(ctx context.Context) {
	project, family, name, ok := k.c.imageRef()
	if !ok {
		k.add(providers.CheckResult{Check: "image", Status: providers.CheckFailed,
			Detail: fmt.Sprintf("%q is not an image or image family path", k.c.Image),
			Fix:    "set image to projects/PROJECT/global/images/NAME or projects/PROJECT/global/images/family/FAMILY"})
		return
	}
	var (
		im  *computepb.Image
		err error
		nf  notFound
	)
	if family != "" {
		im, err = k.cl.images.GetFromFamily(ctx, &computepb.GetFromFamilyImageRequest{Project: project, Family: family})
		nf = notFound{
			detail: fmt.Sprintf("image family %s has no usable image in project %s", family, project),
			fix:    fmt.Sprintf("set image to an existing family (gcloud compute images list --project %s --no-standard-images --filter=family:%s), e.g. projects/debian-cloud/global/images/family/debian-12", project, family),
		}
	} else {
		im, err = k.cl.images.Get(ctx, &computepb.GetImageRequest{Project: project, Image: name})
		nf = notFound{
			detail: fmt.Sprintf("image %s not found in project %s", name, project),
			fix:    fmt.Sprintf("set image to an existing image (gcloud compute images list --project %s) or use an image family", project),
		}
	}
	if err != nil {
		r := k.errRow("image", "", err, nf)
		var ge *googleapi.Error
		if errors.As(err, &ge) && ge.Code == http.StatusForbidden && project != k.c.Project {
			r.Fix = fmt.Sprintf("grant roles/compute.imageUser on project %s to %s: gcloud projects add-iam-policy-binding %s --member=%s --role=roles/compute.imageUser", project, k.who(), project, k.member())
		}
		k.add(r)
		return
	}
	detail := fmt.Sprintf("%s (%s", im.GetName(), im.GetStatus())
	if im.GetFamily() != "" {
		detail += ", family " + im.GetFamily()
	}
	detail += fmt.Sprintf(", %d GB) in project %s", im.GetDiskSizeGb(), project)
	r := providers.CheckResult{Check: "image", Status: providers.CheckOK, Detail: detail}
	switch dep := im.GetDeprecated(); {
	case im.GetStatus() != "READY":
		r.Status, r.Detail = providers.CheckFailed, detail+": not READY"
		r.Fix = "use a READY image, or wait until this one is"
	case dep.GetState() == "OBSOLETE" || dep.GetState() == "DELETED":
		r.Status, r.Detail = providers.CheckFailed, detail+": "+dep.GetState()
		r.Fix = "use a current image" + replacement(dep)
	case im.GetDiskSizeGb() > k.c.diskSizeGB():
		r.Status, r.Detail = providers.CheckFailed, fmt.Sprintf("%s: larger than the %d GB boot disk", detail, k.c.diskSizeGB())
		r.Fix = fmt.Sprintf("set disk_size_gb to at least %d", im.GetDiskSizeGb())
	case dep.GetState() == "DEPRECATED":
		r.Detail = detail + ": deprecated, still usable" + replacement(dep)
	}
	k.add(r)
}

func replacement(d *computepb.DeprecationStatus) string {
	if d.GetReplacement() == "" {
		return ""
	}
	return " (replacement: " + d.GetReplacement() + ")"
}

// --- zones, machine types, accelerators -----------------------------------

// zoneFacts is what the sweep learnt about one zone.
type zoneFacts struct {
	zone    string
	zoneErr error
	info    *computepb.Zone
	mts     map[string]*computepb.MachineType
	mtErrs  map[string]error
	accel   *computepb.AcceleratorType
	accErr  error
	checked bool // zones.get was called (not in quick mode)
}

// sweepZones reads every zone concurrently; the rows are built afterwards
// in block order, so the report does not depend on timing.
func (k *checker) sweepZones(ctx context.Context) []*zoneFacts {
	facts := make([]*zoneFacts, len(k.c.Zones))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8) // a few zones at a time keeps clear of rate limits
	for i, zone := range k.c.Zones {
		f := &zoneFacts{zone: zone, mts: map[string]*computepb.MachineType{}, mtErrs: map[string]error{}}
		facts[i] = f
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			k.sweepZone(ctx, f)
		}()
	}
	wg.Wait()
	return facts
}

func (k *checker) sweepZone(ctx context.Context, f *zoneFacts) {
	if !k.quick {
		f.checked = true
		f.info, f.zoneErr = k.cl.zones.Get(ctx, &computepb.GetZoneRequest{Project: k.c.Project, Zone: f.zone})
		if isNotFound(f.zoneErr) {
			return // every other call in the zone would say the same
		}
	}
	for _, name := range k.c.MachineTypes {
		mt, err := k.cl.mts.Get(ctx, &computepb.GetMachineTypeRequest{Project: k.c.Project, Zone: f.zone, MachineType: name})
		if err != nil && k.quick && zoneGone(err, f.zone) {
			// Quick mode makes no zones.get; report the zone once instead
			// of every type as missing.
			f.checked, f.zoneErr = true, err
			return
		}
		if err != nil {
			f.mtErrs[name] = err
			continue
		}
		f.mts[name] = mt
	}
	if !k.quick && k.c.accel != nil {
		f.accel, f.accErr = k.cl.accels.Get(ctx, &computepb.GetAcceleratorTypeRequest{Project: k.c.Project, Zone: f.zone, AcceleratorType: k.c.accel.Type})
	}
}

// zoneGone reports whether a zonal call failed because the zone itself
// does not exist: a 404 naming the zone, or a 400 "Unknown zone".
func zoneGone(err error, zone string) bool {
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		return false
	}
	return (ge.Code == http.StatusNotFound && strings.Contains(ge.Message, "zones/"+zone+"'")) ||
		(ge.Code == http.StatusBadRequest && strings.Contains(ge.Message, "Unknown zone"))
}

func isNotFound(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusNotFound
}

// zoneRows reports the sweep. A machine or accelerator type missing from
// some zones is fine (those zones are skipped for it, as Offerings does);
// missing from every zone it fails, since nothing could launch it.
func (k *checker) zoneRows(facts []*zoneFacts) {
	offered := map[string][]string{} // machine type → zones
	accelZones := []string{}
	for _, f := range facts {
		for name := range f.mts {
			offered[name] = append(offered[name], f.zone)
		}
		if f.accel != nil {
			accelZones = append(accelZones, f.zone)
		}
	}
	for _, f := range facts {
		if f.checked {
			k.add(k.zoneRow(f))
			if isNotFound(f.zoneErr) || zoneGone(f.zoneErr, f.zone) {
				continue
			}
		}
		for _, name := range k.c.MachineTypes {
			k.add(k.machineTypeRow(f, name, offered[name]))
		}
		if f.checked && k.c.accel != nil {
			k.add(k.acceleratorRow(f, accelZones))
		}
	}
}

func (k *checker) zoneRow(f *zoneFacts) providers.CheckResult {
	if f.zoneErr != nil {
		nf := notFound{
			detail: fmt.Sprintf("zone %s does not exist (for project %s)", f.zone, k.c.Project),
			fix:    fmt.Sprintf("remove %s from zones, or correct it (gcloud compute zones list)", f.zone),
		}
		var ge *googleapi.Error
		if zoneGone(f.zoneErr, f.zone) && errors.As(f.zoneErr, &ge) {
			return providers.CheckResult{Check: "zone", Scope: f.zone, Status: providers.CheckFailed, Detail: nf.detail + ": " + ge.Message, Fix: nf.fix}
		}
		return k.errRow("zone", f.zone, f.zoneErr, nf)
	}
	r := providers.CheckResult{Check: "zone", Scope: f.zone, Status: providers.CheckOK, Detail: f.zone + " is " + f.info.GetStatus()}
	switch dep := f.info.GetDeprecated(); {
	case f.info.GetStatus() != "UP":
		r.Status = providers.CheckFailed
		r.Fix = fmt.Sprintf("remove %s from zones until it is UP again (https://status.cloud.google.com)", f.zone)
	case dep.GetState() == "OBSOLETE" || dep.GetState() == "DELETED":
		r.Status, r.Detail = providers.CheckFailed, r.Detail+" but "+dep.GetState()
		r.Fix = fmt.Sprintf("remove %s from zones", f.zone) + replacement(dep)
	case dep.GetState() == "DEPRECATED":
		r.Detail += ", deprecated" + replacement(dep)
	}
	return r
}

func (k *checker) machineTypeRow(f *zoneFacts, name string, offeredIn []string) providers.CheckResult {
	check := "machine type " + name
	if err, bad := f.mtErrs[name]; bad {
		if !isNotFound(err) {
			return k.errRow(check, f.zone, err, notFound{})
		}
		r := providers.CheckResult{Check: check, Scope: f.zone}
		if len(offeredIn) > 0 {
			// Offerings skips the zone for this type: nothing fails.
			r.Status = providers.CheckOK
			r.Detail = fmt.Sprintf("%s is not offered in %s; fleetd uses it in %s", name, f.zone, strings.Join(offeredIn, ", "))
			return r
		}
		r.Status = providers.CheckFailed
		r.Detail = fmt.Sprintf("%s is not offered in %s, nor in any other zone of the block", name, f.zone)
		r.Fix = fmt.Sprintf("remove %s from machine_types, or add a zone that has it (gcloud compute machine-types list --filter=name=%s)", name, name)
		return r
	}
	mt := f.mts[name]
	detail := fmt.Sprintf("%s: %d vCPUs, %.4g GiB", name, mt.GetGuestCpus(), float64(mt.GetMemoryMb())/1024)
	for _, a := range mt.GetAccelerators() {
		detail += fmt.Sprintf(", %d × %s built in", a.GetGuestAcceleratorCount(), a.GetGuestAcceleratorType())
	}
	if len(mt.GetAccelerators()) == 0 && k.c.accel != nil && attachable(name) {
		detail += fmt.Sprintf(", %d × %s attached", k.c.accel.Count, k.c.accel.Type)
	}
	return providers.CheckResult{Check: check, Scope: f.zone, Status: providers.CheckOK, Detail: detail}
}

func (k *checker) acceleratorRow(f *zoneFacts, inZones []string) providers.CheckResult {
	a := k.c.accel
	check := "accelerator " + a.Type
	usedBy := slices.ContainsFunc(k.c.MachineTypes, attachable)
	if f.accErr != nil {
		if !isNotFound(f.accErr) {
			return k.errRow(check, f.zone, f.accErr, notFound{})
		}
		r := providers.CheckResult{Check: check, Scope: f.zone, Status: providers.CheckOK}
		switch {
		case !usedBy:
			r.Detail = fmt.Sprintf("%s is not offered in %s (unused: no n1-* machine type is configured)", a.Type, f.zone)
		case len(inZones) > 0:
			r.Detail = fmt.Sprintf("%s is not offered in %s; N1 offerings use it in %s", a.Type, f.zone, strings.Join(inZones, ", "))
		default:
			r.Status = providers.CheckFailed
			r.Detail = fmt.Sprintf("%s is not offered in %s, nor in any other zone of the block, so no N1 type gets GPUs", a.Type, f.zone)
			r.Fix = fmt.Sprintf("pick an accelerator the zones have (gcloud compute accelerator-types list --filter=\"zone:(%s)\")", strings.Join(k.c.Zones, " "))
		}
		return r
	}
	limit := int(f.accel.GetMaximumCardsPerInstance())
	r := providers.CheckResult{Check: check, Scope: f.zone, Status: providers.CheckOK,
		Detail: fmt.Sprintf("%s offered, up to %d per VM; the block attaches %d", a.Type, limit, a.Count)}
	if a.Count > limit {
		r.Status = providers.CheckFailed
		r.Fix = fmt.Sprintf("set accelerators count to at most %d", limit)
	}
	if !usedBy {
		r.Detail += " (unused: no n1-* machine type is configured)"
	}
	return r
}

// --- quotas ----------------------------------------------------------------

// gpuQuotaMetrics maps accelerator types to their regional quota metric;
// others get NVIDIA_<MODEL>_GPUS.
var gpuQuotaMetrics = map[string]string{
	"nvidia-tesla-a100":     "NVIDIA_A100_GPUS",
	"nvidia-a100-80gb":      "NVIDIA_A100_80GB_GPUS",
	"nvidia-h100-80gb":      "NVIDIA_H100_GPUS",
	"nvidia-h100-mega-80gb": "NVIDIA_H100_MEGA_GPUS",
	"nvidia-l4":             "NVIDIA_L4_GPUS",
	"nvidia-l4-vws":         "NVIDIA_L4_VWS_GPUS",
	"nvidia-tesla-t4":       "NVIDIA_T4_GPUS",
	"nvidia-tesla-t4-vws":   "NVIDIA_T4_VWS_GPUS",
	"nvidia-tesla-v100":     "NVIDIA_V100_GPUS",
	"nvidia-tesla-p100":     "NVIDIA_P100_GPUS",
	"nvidia-tesla-p100-vws": "NVIDIA_P100_VWS_GPUS",
	"nvidia-tesla-p4":       "NVIDIA_P4_GPUS",
	"nvidia-tesla-p4-vws":   "NVIDIA_P4_VWS_GPUS",
	"nvidia-tesla-k80":      "NVIDIA_K80_GPUS",
}

func gpuQuotaMetric(accelType string) string {
	if m, ok := gpuQuotaMetrics[accelType]; ok {
		return m
	}
	return "NVIDIA_" + strings.ReplaceAll(GPUModel(accelType), "-", "_") + "_GPUS"
}

// cpuQuotaMetrics maps machine series to the regional vCPU quota they
// use; series not listed (G2, A3, E2, ...) get no vCPU row.
var cpuQuotaMetrics = map[string]string{
	"n1": "CPUS", "a2": "A2_CPUS", "n2": "N2_CPUS", "n2d": "N2D_CPUS",
	"c2": "C2_CPUS", "c2d": "C2D_CPUS", "c3": "C3_CPUS", "m1": "M1_CPUS",
	"m2": "M2_CPUS", "m3": "M3_CPUS", "t2d": "T2D_CPUS", "t2a": "T2A_CPUS",
}

// demand is the most of one quota metric a single VM of the block takes,
// and which machine type that is.
type demand struct {
	perVM   int
	example string
}

func (d *demand) add(n int, typ string) {
	if n > d.perVM {
		d.perVM, d.example = n, typ
	}
}

// gpusOf returns the GPUs a VM of mt gets in a zone: built in, or the
// block's accelerators on N1 where the zone has them.
func (k *checker) gpusOf(mt *computepb.MachineType, f *zoneFacts) (string, int) {
	if accs := mt.GetAccelerators(); len(accs) > 0 {
		n := 0
		for _, a := range accs {
			n += int(a.GetGuestAcceleratorCount())
		}
		return accs[0].GetGuestAcceleratorType(), n
	}
	if k.c.accel != nil && attachable(mt.GetName()) && f.accel != nil {
		return k.c.accel.Type, k.c.accel.Count
	}
	return "", 0
}

// quotaRows compares quotas with what the fleet needs. Each region is
// checked for the whole fleet, since placement may put every node in one
// region; a VM type's need is TargetNodes × its per-VM amount, the
// largest configured type deciding.
func (k *checker) quotaRows(ctx context.Context, facts []*zoneFacts) {
	var (
		regions []string
		gpu     = map[string]map[string]*demand{} // region → metric → demand
		cpu     = map[string]map[string]*demand{}
		allGPUs demand
	)
	for _, f := range facts {
		r := regionOf(f.zone)
		if !slices.Contains(regions, r) {
			regions = append(regions, r)
			gpu[r], cpu[r] = map[string]*demand{}, map[string]*demand{}
		}
		for _, name := range k.c.MachineTypes {
			mt, ok := f.mts[name]
			if !ok {
				continue
			}
			if typ, n := k.gpusOf(mt, f); n > 0 {
				m := gpuQuotaMetric(typ)
				if gpu[r][m] == nil {
					gpu[r][m] = &demand{}
				}
				gpu[r][m].add(n, name)
				allGPUs.add(n, name)
			}
			series, _, _ := strings.Cut(name, "-")
			if m := cpuQuotaMetrics[series]; m != "" {
				if cpu[r][m] == nil {
					cpu[r][m] = &demand{}
				}
				cpu[r][m].add(int(mt.GetGuestCpus()), name)
			}
		}
	}
	if k.project != nil && allGPUs.perVM > 0 {
		qs := quotaMap(k.project.GetQuotas())
		if q, ok := qs["GPUS_ALL_REGIONS"]; ok {
			k.add(k.quotaRow("quota GPUS_ALL_REGIONS", "", "", q, allGPUs, ""))
		} else {
			k.add(providers.CheckResult{Check: "quota GPUS_ALL_REGIONS", Status: providers.CheckUnavailable,
				Detail: "the project reports no GPUS_ALL_REGIONS quota", Fix: k.quotaFix("GPUS_ALL_REGIONS", "")})
		}
	}
	for _, r := range regions {
		if len(gpu[r]) == 0 && len(cpu[r]) == 0 {
			continue
		}
		reg, err := k.cl.regions.Get(ctx, &computepb.GetRegionRequest{Project: k.c.Project, Region: r})
		if err != nil {
			k.add(k.errRow("quotas", r, err, notFound{detail: "region " + r + " not found", fix: "correct the zones of region " + r}))
			continue
		}
		if w := reg.GetQuotaStatusWarning(); w != nil {
			k.add(providers.CheckResult{Check: "quotas", Scope: r, Status: providers.CheckUnavailable,
				Detail: "quotas not available: " + w.GetMessage(), Fix: "see " + k.quotasURL()})
			continue
		}
		qs := quotaMap(reg.GetQuotas())
		for _, m := range slices.Sorted(maps.Keys(gpu[r])) {
			k.add(k.standardQuotaRow(r, m, qs, *gpu[r][m]))
			k.add(k.spotQuotaRow(r, m, "PREEMPTIBLE_"+m, qs, *gpu[r][m]))
		}
		for _, m := range slices.Sorted(maps.Keys(cpu[r])) {
			if _, ok := qs[m]; !ok {
				continue // vCPU rows only where the region reports the metric
			}
			k.add(k.standardQuotaRow(r, m, qs, *cpu[r][m]))
			k.add(k.spotQuotaRow(r, m, "PREEMPTIBLE_CPUS", qs, *cpu[r][m]))
		}
		if k.network {
			zones := 0
			for _, f := range facts {
				if regionOf(f.zone) == r {
					zones++
				}
			}
			k.add(k.policyQuotaRow(r, qs, zones))
		}
	}
}

// policyQuotaRow checks the region's RESOURCE_POLICIES quota for the fast
// network's compact placement policies: one per fleet incarnation and
// zone the fleet may use.
func (k *checker) policyQuotaRow(region string, qs map[string]*computepb.Quota, zones int) providers.CheckResult {
	const metric = "RESOURCE_POLICIES"
	q, ok := qs[metric]
	if !ok {
		return providers.CheckResult{Check: "quota " + metric, Scope: region, Status: providers.CheckUnavailable,
			Detail: region + " reports no " + metric + " quota", Fix: "look it up at " + k.quotasURL()}
	}
	free := q.GetLimit() - q.GetUsage()
	r := providers.CheckResult{Check: "quota " + metric, Scope: region, Status: providers.CheckOK,
		Detail: fmt.Sprintf("limit %g, used %g, %g free; compact placement needs %d (one per zone)", q.GetLimit(), q.GetUsage(), free, zones)}
	if free < float64(zones) {
		r.Status = providers.CheckFailed
		r.Fix = fmt.Sprintf("delete unused resource policies in %s (gcloud compute resource-policies list) or request more %s at %s", region, metric, k.quotasURL())
	}
	return r
}

func quotaMap(qs []*computepb.Quota) map[string]*computepb.Quota {
	out := make(map[string]*computepb.Quota, len(qs))
	for _, q := range qs {
		out[q.GetMetric()] = q
	}
	return out
}

func (k *checker) standardQuotaRow(region, metric string, qs map[string]*computepb.Quota, d demand) providers.CheckResult {
	q, ok := qs[metric]
	if !ok {
		return providers.CheckResult{Check: "quota " + metric, Scope: region, Status: providers.CheckUnavailable,
			Detail: fmt.Sprintf("%s reports no %s quota (on-demand quota for this GPU may be managed only in Cloud Quotas)", region, metric),
			Fix:    "look up the GPU quota for " + region + " at " + k.quotasURL()}
	}
	return k.quotaRow("quota "+metric, region, "", q, d, "")
}

// spotQuotaRow checks what Spot VMs use: the PREEMPTIBLE_ metric when its
// limit is above zero, otherwise the standard one.
func (k *checker) spotQuotaRow(region, metric, preemptible string, qs map[string]*computepb.Quota, d demand) providers.CheckResult {
	check := "quota spot " + metric
	if pq, ok := qs[preemptible]; ok && pq.GetLimit() > 0 {
		return k.quotaRow(check, region, preemptible, pq, d, fmt.Sprintf("Spot VMs count against %s (its limit is above 0): ", preemptible))
	}
	q, ok := qs[metric]
	if !ok {
		return providers.CheckResult{Check: check, Scope: region, Status: providers.CheckUnavailable,
			Detail: fmt.Sprintf("%s reports neither %s above 0 nor %s", region, preemptible, metric),
			Fix:    "look up the Spot GPU quota for " + region + " at " + k.quotasURL()}
	}
	return k.quotaRow(check, region, metric, q, d, fmt.Sprintf("%s is 0 or absent, so Spot VMs count against %s: ", preemptible, metric))
}

// quotaRow compares one quota's free amount with the fleet's need;
// request names the metric to raise when it is short.
func (k *checker) quotaRow(check, scope, request string, q *computepb.Quota, d demand, note string) providers.CheckResult {
	if request == "" {
		request = q.GetMetric()
	}
	need := float64(k.nodes * d.perVM)
	free := q.GetLimit() - q.GetUsage()
	r := providers.CheckResult{Check: check, Scope: scope, Status: providers.CheckOK,
		Detail: fmt.Sprintf("%s%s limit %g, used %g, %g free; %d node%s × %d (%s) need %g",
			note, q.GetMetric(), q.GetLimit(), q.GetUsage(), free, k.nodes, plural(k.nodes), d.perVM, d.example, need)}
	if free < need {
		r.Status = providers.CheckFailed
		r.Fix = k.quotaFix(request, scope)
	}
	return r
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func (k *checker) quotaFix(metric, region string) string {
	where := "globally"
	if region != "" {
		where = "in " + region
	}
	return fmt.Sprintf("request quota %s %s at %s", metric, where, k.quotasURL())
}

func (k *checker) quotasURL() string { return quotasPage + "?project=" + k.c.Project }

// --- permissions -------------------------------------------------------------

const (
	roleInstanceAdmin = "roles/compute.instanceAdmin.v1"
	roleSAUser        = "roles/iam.serviceAccountUser"
	permActAs         = "iam.serviceAccounts.actAs"
)

// permission is one IAM permission fleetd's calls need and why.
type permission struct {
	name, role, why string
}

// permissions lists what the block's launches, lookups and cleanups need
// on the project, in a fixed order. Network and image permissions that
// belong to another project (shared VPC, public images) are left out: a
// project-level test here cannot see them.
func (k *checker) permissions() []permission {
	ps := []permission{
		{"compute.instances.create", roleInstanceAdmin, "launch nodes"},
		{"compute.instances.delete", roleInstanceAdmin, "terminate nodes"},
		{"compute.instances.get", roleInstanceAdmin, "watch node status"},
		{"compute.instances.list", roleInstanceAdmin, "find the fleet's nodes (aggregatedList)"},
		{"compute.instances.setMetadata", roleInstanceAdmin, "write user-data and fleetd metadata at launch"},
		{"compute.instances.setLabels", roleInstanceAdmin, "label nodes with their tags at launch"},
		{"compute.disks.create", roleInstanceAdmin, "create boot disks"},
		{"compute.machineTypes.list", roleInstanceAdmin, "list offerings"},
		{"compute.acceleratorTypes.list", roleInstanceAdmin, "list offerings"},
		{"compute.zoneOperations.get", roleInstanceAdmin, "wait for launches and deletions"},
		{"compute.zoneOperations.list", roleInstanceAdmin, "detect Spot preemptions"},
	}
	if k.ownProject(k.c.network()) && k.ownProject(k.c.subnetwork("REGION")) {
		ps = append(ps, permission{"compute.subnetworks.use", roleInstanceAdmin, "attach nodes to the VPC"})
		if k.c.externalIP() {
			ps = append(ps, permission{"compute.subnetworks.useExternalIp", roleInstanceAdmin, "give nodes an external IP"})
		}
		if k.c.Subnetwork == "" {
			ps = append(ps, permission{"compute.networks.use", roleInstanceAdmin, "attach nodes to the network"})
		}
	}
	if k.network {
		ps = append(ps,
			permission{"compute.resourcePolicies.create", roleInstanceAdmin, "create the compact placement policy"},
			permission{"compute.resourcePolicies.get", roleInstanceAdmin, "reuse the compact placement policy"},
			permission{"compute.resourcePolicies.delete", roleInstanceAdmin, "delete the policy when the fleet is destroyed"},
			permission{"compute.resourcePolicies.use", roleInstanceAdmin, "launch nodes into the policy"})
	}
	if project, _, _, ok := k.c.imageRef(); ok && project == k.c.Project {
		ps = append(ps, permission{"compute.images.useReadOnly", roleInstanceAdmin, "boot from the project's image"})
	}
	if k.c.ServiceAccount != "" {
		ps = append(ps,
			permission{"compute.instances.setServiceAccount", roleInstanceAdmin, "run nodes as " + k.c.ServiceAccount},
			permission{permActAs, roleSAUser, "run nodes as " + k.c.ServiceAccount})
	}
	return ps
}

var projectPathRE = regexp.MustCompile(`(?:^|/)projects/([^/]+)/`)

// ownProject reports whether a resource path is in the block's project
// (a relative path is).
func (k *checker) ownProject(path string) bool {
	m := projectPathRE.FindStringSubmatch(path)
	return m == nil || m[1] == k.c.Project
}

// rmBase is the Resource Manager endpoint: the block's override, else a
// plain-http Compute endpoint (a local fake serves every API), else the
// public one. iamBase follows the same rule.
func (k *checker) rmBase() string {
	return k.apiBase(k.c.ResourceManagerEndpoint, ResourceManagerEndpoint)
}

// apiBase is the endpoint of an API other than Compute Engine: the
// block's override, else a plain-http Compute endpoint, else public.
func (k *checker) apiBase(override, public string) string {
	switch {
	case override != "":
		return override
	case plainHTTP(k.c.Endpoint):
		return k.c.Endpoint
	}
	return public
}

func (k *checker) iamBase() string {
	if plainHTTP(k.c.Endpoint) {
		return k.c.Endpoint
	}
	return IAMEndpoint
}

// httpClient returns a client for u: plain for a plain-http URL (no
// credentials to a fake or proxy), else one authenticated like the
// Compute Engine clients.
func (k *checker) httpClient(ctx context.Context, u string) (*http.Client, error) {
	if plainHTTP(u) {
		return &http.Client{Timeout: 30 * time.Second}, nil
	}
	opts := append([]option.ClientOption{option.WithScopes(DefaultScope)}, k.p.opts.ClientOptions...)
	hc, _, err := htransport.NewClient(ctx, opts...)
	return hc, err
}

func (k *checker) permissionRows(ctx context.Context) {
	need := k.permissions()
	names := make([]string, len(need))
	for i, p := range need {
		names[i] = p.name
	}
	base := k.rmBase()
	granted, err := k.testPermissions(ctx, base, "v1/projects/"+k.c.Project+":testIamPermissions", names)
	if err != nil {
		k.add(k.rmErrRow(err, base))
		return
	}
	var missing []permission
	for _, p := range need {
		if !granted[p.name] {
			missing = append(missing, p)
		}
	}
	// A grant of actAs on the service account itself does not show at the
	// project level: ask IAM about the account before calling it missing.
	var saNote string
	if i := slices.IndexFunc(missing, func(p permission) bool { return p.name == permActAs }); i >= 0 {
		ok, err := k.testPermissions(ctx, k.iamBase(), "v1/projects/-/serviceAccounts/"+k.c.ServiceAccount+":testIamPermissions", []string{permActAs})
		switch {
		case err == nil && ok[permActAs]:
			missing = slices.Delete(missing, i, i+1)
			saNote = fmt.Sprintf("; %s granted on %s", permActAs, k.c.ServiceAccount)
		case err != nil:
			missing = slices.Delete(missing, i, i+1)
			k.add(providers.CheckResult{Check: "permission " + permActAs, Status: providers.CheckUnavailable,
				Detail: fmt.Sprintf("not granted on project %s, and IAM could not be asked about %s: %v", k.c.Project, k.c.ServiceAccount, err),
				Fix:    k.actAsFix() + ", or enable iam.googleapis.com so this can be checked"})
		}
	}
	if len(missing) == 0 {
		k.add(providers.CheckResult{Check: "permissions", Status: providers.CheckOK,
			Detail: fmt.Sprintf("all %d permissions fleetd uses are granted on project %s%s", len(need), k.c.Project, saNote)})
		return
	}
	for _, p := range missing {
		r := providers.CheckResult{Check: "permission " + p.name, Status: providers.CheckFailed,
			Detail: fmt.Sprintf("%s is not granted on project %s (needed to %s)", p.name, k.c.Project, p.why)}
		if p.name == permActAs {
			r.Detail = fmt.Sprintf("%s is granted neither on project %s nor on %s (needed to %s)", p.name, k.c.Project, k.c.ServiceAccount, p.why)
			r.Fix = k.actAsFix()
		} else {
			r.Fix = k.grantFix(p.role)
		}
		k.add(r)
	}
}

func (k *checker) actAsFix() string {
	return fmt.Sprintf("grant %s on %s to %s: gcloud iam service-accounts add-iam-policy-binding %s --member=%s --role=%s",
		roleSAUser, k.c.ServiceAccount, k.who(), k.c.ServiceAccount, k.member(), roleSAUser)
}

// rmErrRow reports a testIamPermissions call that failed: fleetd works
// without it (a denial shows at launch), so it is unavailable.
func (k *checker) rmErrRow(err error, base string) providers.CheckResult {
	r := providers.CheckResult{Check: "permissions", Status: providers.CheckUnavailable}
	var ae *apiError
	switch {
	case errors.As(err, &ae) && ae.code == http.StatusForbidden && apiDisabled(ae.message, ae.reasons):
		r.Detail = "the Cloud Resource Manager API is not enabled, so permissions were not tested: " + ae.message
		r.Fix = "gcloud services enable cloudresourcemanager.googleapis.com --project " + k.c.Project
	case errors.As(err, &ae) && ae.code == http.StatusForbidden:
		r.Detail = "Resource Manager refused the permission test: " + ae.message
		r.Fix = fmt.Sprintf("the caller may have no role on project %s at all: %s", k.c.Project, k.grantFix(roleInstanceAdmin))
	case errors.As(err, &ae):
		r.Detail = fmt.Sprintf("Resource Manager at %s answered %d: %s", base, ae.code, ae.message)
		r.Fix = "retry; if it persists, check resource_manager_endpoint"
	default:
		r.Detail = "permissions not tested: " + err.Error()
		r.Fix = "check network access to " + base + " and retry"
	}
	return r
}

// apiError is an error answer of Resource Manager or IAM, in either
// shape: google.rpc.Status (details[].reason) or googleapi
// (errors[].reason).
type apiError struct {
	code    int
	message string
	reasons []string
}

func (e *apiError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.code, e.message) }

// testPermissions POSTs a testIamPermissions request and returns the
// granted subset.
func (k *checker) testPermissions(ctx context.Context, base, path string, perms []string) (map[string]bool, error) {
	hc, err := k.httpClient(ctx, base)
	if err != nil {
		return nil, fmt.Errorf("http client: %w", err)
	}
	body, err := json.Marshal(map[string][]string{"permissions": perms})
	if err != nil {
		return nil, err
	}
	u := strings.TrimSuffix(base, "/") + "/" + path
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("testIamPermissions: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("testIamPermissions: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("testIamPermissions: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, parseAPIError(resp.StatusCode, b)
	}
	var out struct {
		Permissions []string `json:"permissions"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("testIamPermissions: decode answer: %w", err)
	}
	granted := make(map[string]bool, len(out.Permissions))
	for _, p := range out.Permissions {
		granted[p] = true
	}
	return granted, nil
}

func parseAPIError(code int, body []byte) *apiError {
	var e struct {
		Error struct {
			Message string `json:"message"`
			Errors  []struct {
				Reason string `json:"reason"`
			} `json:"errors"`
			Details []struct {
				Reason string `json:"reason"`
			} `json:"details"`
		} `json:"error"`
	}
	out := &apiError{code: code}
	if json.Unmarshal(body, &e) != nil || e.Error.Message == "" {
		out.message = strings.TrimSpace(string(body))
		if len(out.message) > 200 {
			out.message = out.message[:200]
		}
		if out.message == "" {
			out.message = http.StatusText(code)
		}
		return out
	}
	out.message = e.Error.Message
	for _, it := range e.Error.Errors {
		out.reasons = append(out.reasons, it.Reason)
	}
	for _, d := range e.Error.Details {
		if d.Reason != "" {
			out.reasons = append(out.reasons, d.Reason)
		}
	}
	return out
}

// --- prices ------------------------------------------------------------------

// BillingEndpoint is the public Cloud Billing API endpoint.
const BillingEndpoint = "https://cloudbilling.googleapis.com/"

// pricesRow asks the Cloud Billing Catalog for one SKU, with the
// credentials Offerings reads prices with. The catalog needs no IAM role,
// only the Cloud Billing API enabled in the project the credentials bill
// API calls to (or an API key); without it fleetd prices from the bundled
// table, so a failure is unavailable, not failed. A block that never reads
// the catalog (a plain-http endpoint and no billing_endpoint) gets no row.
func (k *checker) pricesRow(ctx context.Context) {
	if !k.c.asksCatalog() {
		return
	}
	bundled := fmt.Sprintf("prices come from the bundled table dated %s", PriceTableDate)
	r := providers.CheckResult{Check: "prices", Status: providers.CheckUnavailable}
	svc, err := k.p.billingService(ctx, k.c)
	if err == nil {
		_, err = svc.Services.Skus.List(ComputeEngineService).PageSize(1).Fields("nextPageToken", "skus(skuId)").Context(ctx).Do()
	}
	endpoint := k.c.billingEndpoint()
	if endpoint == "" {
		endpoint = BillingEndpoint
	}
	var ae *apierror.APIError
	var nc *noCredentialsError
	switch {
	case err == nil:
		r.Status = providers.CheckOK
		r.Detail = fmt.Sprintf("the Cloud Billing Catalog is readable: on-demand and Spot prices come from it (read every %s)", k.p.opts.PriceTTL)
		k.add(r)
		return
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		r.Detail, r.Fix = "not checked: "+err.Error(), "run the check again with more time"
	case errors.As(err, &nc):
		r.Detail, r.Fix = "no credentials for the Cloud Billing Catalog ("+err.Error()+"); "+bundled, credentialsFix+", or set FLEETD_GCP_BILLING_API_KEY for the daemon"
	case errors.As(err, &ae) && ae.HTTPCode() > 0:
		r.Detail = fmt.Sprintf("the Cloud Billing Catalog answered %d %s: %s; %s", ae.HTTPCode(), ae.Reason(), ae.Message(), bundled)
		r.Detail = strings.Replace(r.Detail, " : ", ": ", 1)
		r.Fix = k.billingFix(ae)
	default:
		r.Detail = "no answer from the Cloud Billing Catalog: " + err.Error() + "; " + bundled
		r.Fix = "check network access to " + endpoint + " and retry"
	}
	k.add(r)
}

// billingFix tells how to let fleetd read the catalog after an error.
func (k *checker) billingFix(ae *apierror.APIError) string {
	project := k.c.Project
	if c, ok := strings.CutPrefix(ae.Metadata()["consumer"], "projects/"); ok && c != "" {
		project = c
	}
	enable := "gcloud services enable cloudbilling.googleapis.com --project " + project
	switch {
	case ae.Reason() == "SERVICE_DISABLED":
		return "optional: " + enable + " (the catalog needs no IAM role); placement works with the bundled prices"
	case ae.Reason() == "API_KEY_INVALID":
		return "optional: fix or unset FLEETD_GCP_BILLING_API_KEY; placement works with the bundled prices"
	case ae.HTTPCode() == http.StatusTooManyRequests || ae.HTTPCode() >= 500:
		return "retry later; placement uses the last prices read, else the bundled ones"
	}
	return "optional: the catalog needs the Cloud Billing API enabled in the credentials' project (" + enable + ") or an API key in FLEETD_GCP_BILLING_API_KEY; placement works with the bundled prices"
}
